//! `smallrl logprobs`: the log-probability the model gives each next token of a text.

use anyhow::{Result, ensure};
use clap::Args;
use tch::{Kind, Tensor};

use super::common::{ChatArgs, ModelArgs};

#[derive(Args, Debug)]
pub struct LogprobsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to score (encoded without special tokens).
    #[arg(long)]
    pub prompt: String,
    /// With --chat the text scored is the prompt rendered as one user message (and the
    /// generation prompt) by the model's chat template.
    #[command(flatten)]
    pub chat: ChatArgs,
    /// Print JSON: {ids, tokens, logprobs} with logprobs[i] = log p(ids[i+1] | ids[..=i]).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: LogprobsArgs) -> Result<()> {
    let loaded = args.model.load()?;
    let text = args.chat.prompt_texts(&loaded.files, std::slice::from_ref(&args.prompt))?.remove(0);
    let ids = loaded.tokenizer.encode(&text)?;
    ensure!(!ids.is_empty(), "the prompt encodes to no tokens");
    let tokens = loaded.tokenizer.token_strings(&ids)?;
    let input = Tensor::from_slice(&ids.iter().map(|&i| i as i64).collect::<Vec<_>>())
        .unsqueeze(0)
        .to(loaded.model.device);
    let logprobs: Vec<f64> = tch::no_grad(|| -> Result<Vec<f64>> {
        let hidden = loaded.model.forward(&input, &input.ones_like(), &[]);
        let logp = loaded.model.logits(&hidden).log_softmax(-1, Kind::Float).squeeze_dim(0);
        let n = ids.len() as i64 - 1;
        let next = input.squeeze_dim(0).narrow(0, 1, n).unsqueeze(1);
        let picked = logp.narrow(0, 0, n).gather(1, &next, false).squeeze_dim(1);
        Ok(Vec::<f64>::try_from(picked.to_kind(Kind::Double).to_device(tch::Device::Cpu))?)
    })?;
    if args.json {
        println!("{}", serde_json::json!({"ids": ids, "tokens": tokens, "logprobs": logprobs}));
        return Ok(());
    }
    println!("{:>6}  {:<16} {:>10}", "id", "token", "logprob");
    for (i, (id, token)) in ids.iter().zip(&tokens).enumerate() {
        let lp = if i == 0 { "-".to_string() } else { format!("{:.4}", logprobs[i - 1]) };
        println!("{id:>6}  {token:<16} {lp:>10}");
    }
    println!("total log-probability of tokens 2..{}: {:.4}", ids.len(), logprobs.iter().sum::<f64>());
    Ok(())
}
