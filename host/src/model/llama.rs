//! LLaMA forward pass for scoring and training: the whole sequence at once, adapters honoured
//! per row. Incremental decoding lives in [`super::decode`], which folds the adapters into
//! fused weights; both paths must agree (tested against transformers' logits).

use anyhow::Result;
use tch::{Device, Kind, Tensor};

use super::autocast;
use super::config::LlamaConfig;
use super::linear::{AdapterCtl, Linear, rows_per_run, times_transposed};
use super::mlp_adapter::{self, MlpAdapter};
use super::rope::{self, Rope};

pub struct Attention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    /// Qwen3's RMSNorm weights `[head_dim]` over each head of q and of k, applied after the
    /// projection and before RoPE (`None` for LLaMA and Qwen2).
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
}

pub struct Mlp {
    pub gate_proj: Linear,
    pub up_proj: Linear,
    pub down_proj: Linear,
    /// DualMLP's adapters, one entry per adapter slot (empty otherwise; `None` in layers
    /// without one).
    pub adapters: Vec<Option<MlpAdapter>>,
}

pub struct Block {
    pub input_layernorm: Tensor,
    pub self_attn: Attention,
    pub post_attention_layernorm: Tensor,
    pub mlp: Mlp,
}

pub struct Llama {
    pub config: LlamaConfig,
    pub embed_tokens: Tensor,
    pub layers: Vec<Block>,
    pub norm: Tensor,
    /// `None` when the head is tied to `embed_tokens`.
    pub lm_head: Option<Tensor>,
    pub rope: Rope,
    pub device: Device,
    pub kind: Kind,
    /// The kind of the passes' matrix products when not `kind` (`train_dtype` bfloat16:
    /// mixed precision, [`autocast`]); `None` as built.
    pub autocast: Option<Kind>,
}

/// The names of the seven adaptable projections of a block, in HF order.
pub const PROJECTIONS: [&str; 7] =
    ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

/// HF module name of projection `p` (an index into [`PROJECTIONS`]) of layer `layer`.
pub fn projection_name(layer: usize, p: usize) -> String {
    let group = if p < 4 { "self_attn" } else { "mlp" };
    format!("model.layers.{layer}.{group}.{}", PROJECTIONS[p])
}

impl Attention {
    /// `[q, k, v, o]`, the projections in HF order (the decoder fuses the first three).
    pub fn projections(&self) -> [&Linear; 4] {
        [&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj]
    }

    fn forward(&self, x: &Tensor, cfg: &LlamaConfig, rope: (&Tensor, &Tensor), mask: &Tensor, ctl: &[AdapterCtl]) -> Tensor {
        let (b, t, _) = x.size3().expect("attention input must be [batch, seq, hidden]");
        let heads = |y: Tensor, n: usize| y.view([b, t, n as i64, cfg.head_dim as i64]).transpose(1, 2);
        let q = heads(self.q_proj.forward(x, ctl), cfg.num_attention_heads);
        let k = heads(self.k_proj.forward(x, ctl), cfg.num_key_value_heads);
        let (q, k) = match (&self.q_norm, &self.k_norm) {
            (Some(q_norm), Some(k_norm)) => (rms_norm(&q, q_norm, cfg.rms_norm_eps), rms_norm(&k, k_norm, cfg.rms_norm_eps)),
            (None, None) => (q, k),
            _ => unreachable!("Llama::build reads both q_norm and k_norm or neither"),
        };
        let v = heads(self.v_proj.forward(x, ctl), cfg.num_key_value_heads);
        let (cos, sin) = rope;
        let q = rope::apply(&q, cos, sin);
        let k = rope::apply(&k, cos, sin);
        let out = attend(&q, &k, &v, mask, cfg);
        let out = out.transpose(1, 2).reshape([b, t, cfg.q_size() as i64]);
        self.o_proj.forward(&out, ctl)
    }
}

/// Scaled dot-product attention with grouped key/value heads; `mask` is boolean, true = attend.
pub fn attend(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, cfg: &LlamaConfig) -> Tensor {
    let gqa = cfg.num_attention_heads != cfg.num_key_value_heads;
    let (q, k, v) = (autocast::cast(q), autocast::cast(k), autocast::cast(v));
    Tensor::scaled_dot_product_attention(&q, &k, &v, Some(mask), 0.0, false, None, gqa)
}

impl Mlp {
    fn forward(&self, x: &Tensor, ctl: &[AdapterCtl]) -> Tensor {
        let gate = self.gate_proj.forward(x, ctl).silu();
        let up = self.up_proj.forward(x, ctl);
        let mut out = self.down_proj.forward(&(gate * up), ctl);
        for (adapter, ctl) in self.adapters.iter().zip(ctl) {
            if let Some(adapter) = adapter.as_ref().filter(|_| !ctl.is_off()) {
                out = out + adapter.forward(x, ctl);
            }
        }
        out
    }

    /// `(gate, up, down)` of one SwiGLU equal to this block with its LoRA and DualMLP adapters
    /// folded in at `scales`, `width` neurons wide ([`mlp_adapter::folded`]).
    pub fn folded(&self, scales: &[f64], width: i64) -> [Tensor; 3] {
        let merged = [&self.gate_proj, &self.up_proj, &self.down_proj].map(|l| l.merged_weight(scales));
        if self.adapters.is_empty() {
            return merged;
        }
        mlp_adapter::folded([&merged[0], &merged[1], &merged[2]], &self.adapters, scales, width)
    }
}

/// RMSNorm computed in float32 (as transformers does for half-precision weights). A weight
/// `[runs, hidden]` (runs stacked on a leading axis, see [`super::stacked`]) scales each of
/// `runs` equal slices of `x`'s rows by its own run's weight.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
    let d = *x.size().last().expect("rms_norm input has no dimensions");
    if x.kind() == Kind::Float && weight.dim() == 1 {
        return x.rms_norm([d], Some(weight), eps);
    }
    let normed = x.to_kind(Kind::Float).rms_norm([d], None::<Tensor>, eps).to_kind(x.kind());
    if weight.dim() == 1 {
        return normed * weight;
    }
    let runs = weight.size()[0];
    (normed.reshape([runs, -1, d]) * weight.unsqueeze(1)).view(x.size().as_slice())
}

/// Token embeddings of `ids` (`[rows, n]`) from `table` (`[vocab, hidden]`); from a stacked
/// table `[runs, vocab, hidden]`, each of `runs` equal slices of the rows looks up its own run's.
pub fn embed(table: &Tensor, ids: &Tensor) -> Tensor {
    if table.dim() == 2 {
        return Tensor::embedding(table, ids, -1, false, false);
    }
    let (runs, vocab, hidden) = table.size3().expect("a stacked embedding table is [runs, vocab, hidden]");
    let (rows, _) = ids.size2().expect("ids must be [rows, n]");
    let run_of_row = Tensor::arange(rows, (Kind::Int64, ids.device())).divide_scalar_mode(rows_per_run(rows, runs), "floor");
    Tensor::embedding(&table.reshape([runs * vocab, hidden]), &(ids + run_of_row.unsqueeze(1) * vocab), -1, false, false)
}

impl Llama {
    /// Hidden states after the final norm, `[batch, seq, hidden]`.
    ///
    /// `attention_mask` (`[batch, seq]`, 1 = token, 0 = padding) may pad on either side.
    /// Positions are `0..seq` on every row, as in TRL's scoring forward pass; RoPE depends only
    /// on relative positions, so left padding does not change a real token's result.
    pub fn forward(&self, input_ids: &Tensor, attention_mask: &Tensor, ctl: &[AdapterCtl]) -> Tensor {
        let (b, t) = input_ids.size2().expect("input_ids must be [batch, seq]");
        assert!(
            t as usize <= self.config.max_position_embeddings,
            "sequence of {t} tokens exceeds max_position_embeddings {}",
            self.config.max_position_embeddings
        );
        let positions = Tensor::arange(t, (Kind::Int64, self.device)).unsqueeze(0).expand([b, t], false);
        self.forward_masked(input_ids, &positions, &training_mask(attention_mask), ctl)
    }

    /// [`Self::forward`] with explicit `[batch, seq]` positions and a boolean
    /// `[batch, 1, seq, seq]` attention mask (true = attend), for packed sequences whose
    /// documents must not see each other (see [`document_mask`]).
    pub fn forward_masked(&self, input_ids: &Tensor, positions: &Tensor, mask: &Tensor, ctl: &[AdapterCtl]) -> Tensor {
        let _autocast = autocast::enter(self.autocast);
        let (cos, sin) = self.rope.at(positions, self.kind);
        let mut x = embed(&self.embed_tokens, input_ids);
        let eps = self.config.rms_norm_eps;
        for block in &self.layers {
            let h = rms_norm(&x, &block.input_layernorm, eps);
            x = x + block.self_attn.forward(&h, &self.config, (&cos, &sin), &mask, ctl);
            let h = rms_norm(&x, &block.post_attention_layernorm, eps);
            x = x + block.mlp.forward(&h, ctl);
        }
        rms_norm(&x, &self.norm, eps)
    }

    /// The architecture's one description: every base tensor's HF name and the shape
    /// `config.json` implies, written beside the field it fills. Everything that makes a model
    /// makes it here, from a `source` of tensors by name and shape: loading (`weights.rs`, which
    /// checks what the files hold), the frozen reference ([`Self::frozen_copy`]), stacking
    /// (`stacked.rs`) and pre-training's initialisation; [`Self::base_tensors`] walks the same
    /// fields back in the same order (a test holds the two to each other).
    /// `rope` is the configuration's tables ([`Rope::for_config`]), or a model's own shared.
    pub fn build(config: LlamaConfig, source: &mut dyn FnMut(&str, &[usize]) -> Result<Tensor>, rope: Rope, device: Device, kind: Kind) -> Result<Self> {
        let (h, i, vocab) = (config.hidden_size, config.intermediate_size, config.vocab_size);
        let (q, kv) = (config.q_size(), config.kv_size());
        let embed_tokens = source("model.embed_tokens.weight", &[vocab, h])?;
        // Every layer's norms, then every layer's projections: the order of
        // [`Self::base_tensors`], which optimizer states, checkpoints and seeded
        // initialisations have always followed.
        let layer = |l: usize, name: &str| format!("model.layers.{l}.{name}.weight");
        // Qwen3's per-head q/k norms are listed with the layer norms (after them).
        let (qk_norm, qkv_bias) = (config.model_type.qk_norm(), config.model_type.qkv_bias());
        let mut norms = Vec::with_capacity(config.num_hidden_layers);
        for l in 0..config.num_hidden_layers {
            let (input, post) = (source(&layer(l, "input_layernorm"), &[h])?, source(&layer(l, "post_attention_layernorm"), &[h])?);
            let head_norms = if qk_norm {
                (Some(source(&layer(l, "self_attn.q_norm"), &[config.head_dim])?), Some(source(&layer(l, "self_attn.k_norm"), &[config.head_dim])?))
            } else {
                (None, None)
            };
            norms.push((input, post, head_norms));
        }
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for (l, (input_layernorm, post_attention_layernorm, (q_norm, k_norm))) in norms.into_iter().enumerate() {
            // A projection's weight, then its bias where the family has one (Qwen2's q/k/v).
            let mut linear = |name: &str, out: usize, inp: usize, biased: bool| -> Result<Linear> {
                let weight = source(&layer(l, name), &[out, inp])?;
                let bias = if biased { Some(source(&format!("model.layers.{l}.{name}.bias"), &[out])?) } else { None };
                Ok(Linear::with_bias(weight, bias))
            };
            let self_attn = Attention {
                q_proj: linear("self_attn.q_proj", q, h, qkv_bias)?,
                k_proj: linear("self_attn.k_proj", kv, h, qkv_bias)?,
                v_proj: linear("self_attn.v_proj", kv, h, qkv_bias)?,
                o_proj: linear("self_attn.o_proj", h, q, false)?,
                q_norm,
                k_norm,
            };
            let mlp = Mlp {
                gate_proj: linear("mlp.gate_proj", i, h, false)?,
                up_proj: linear("mlp.up_proj", i, h, false)?,
                down_proj: linear("mlp.down_proj", h, i, false)?,
                adapters: Vec::new(),
            };
            layers.push(Block { input_layernorm, self_attn, post_attention_layernorm, mlp });
        }
        let norm = source("model.norm.weight", &[h])?;
        let lm_head = if config.tie_word_embeddings { None } else { Some(source("lm_head.weight", &[vocab, h])?) };
        Ok(Self { config, embed_tokens, layers, norm, lm_head, rope, device, kind, autocast: None })
    }

    /// A copy of the base weights outside autograd: the frozen reference policy of full
    /// fine-tuning (adapters are not copied; the RoPE tables are shared, they never change).
    pub fn frozen_copy(&self) -> Self {
        let base: std::collections::HashMap<String, &Tensor> = self.base_tensors().into_iter().collect();
        let mut copy = Self::build(self.config.clone(), &mut |name, _| Ok(base[name].detach().copy()), self.rope.shared(), self.device, self.kind)
            .expect("a model's own tensors rebuild it");
        copy.autocast = self.autocast;
        copy
    }

    /// `[.., vocab]` logits of hidden states.
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        times_transposed(hidden, self.head_weight())
    }

    pub fn head_weight(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }

    /// Number of adapter slots every linear layer has (0 without adapters).
    pub fn adapter_slots(&self) -> usize {
        self.layers.first().map_or(0, |b| b.self_attn.q_proj.adapters.len())
    }

    /// The MLP width of every layer once the adapters are folded in at `scales`: the base
    /// `intermediate_size` plus the most DualMLP neurons any layer adds.
    pub fn folded_intermediate_size(&self, scales: &[f64]) -> usize {
        let extra = self.layers.iter().map(|b| mlp_adapter::extra_neurons(&b.mlp.adapters, scales)).max().unwrap_or(0);
        self.config.intermediate_size + extra as usize
    }

    /// Every adaptable projection with its HF module name (`model.layers.{i}.self_attn.q_proj`).
    pub fn projections(&self) -> Vec<(String, &Linear)> {
        let mut out = Vec::new();
        for (i, block) in self.layers.iter().enumerate() {
            let (a, m) = (&block.self_attn, &block.mlp);
            let [q, k, v, o] = a.projections();
            let linears = [q, k, v, o, &m.gate_proj, &m.up_proj, &m.down_proj];
            out.extend(linears.into_iter().enumerate().map(|(p, l)| (projection_name(i, p), l)));
        }
        out
    }

    pub fn projections_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let mut out = Vec::new();
        for (i, block) in self.layers.iter_mut().enumerate() {
            let (a, m) = (&mut block.self_attn, &mut block.mlp);
            let linears = [
                &mut a.q_proj, &mut a.k_proj, &mut a.v_proj, &mut a.o_proj,
                &mut m.gate_proj, &mut m.up_proj, &mut m.down_proj,
            ];
            out.extend(linears.into_iter().enumerate().map(|(p, l)| (projection_name(i, p), l)));
        }
        out
    }

    /// The base weights under their HF tensor names (no adapters), in [`Self::build`]'s order.
    /// Tied models list the embedding once, as transformers saves them.
    pub fn base_tensors(&self) -> Vec<(String, &Tensor)> {
        let mut out = vec![("model.embed_tokens.weight".to_string(), &self.embed_tokens)];
        for (i, block) in self.layers.iter().enumerate() {
            out.push((format!("model.layers.{i}.input_layernorm.weight"), &block.input_layernorm));
            out.push((format!("model.layers.{i}.post_attention_layernorm.weight"), &block.post_attention_layernorm));
            let attn = &block.self_attn;
            if let (Some(q_norm), Some(k_norm)) = (&attn.q_norm, &attn.k_norm) {
                out.push((format!("model.layers.{i}.self_attn.q_norm.weight"), q_norm));
                out.push((format!("model.layers.{i}.self_attn.k_norm.weight"), k_norm));
            }
        }
        for (name, linear) in self.projections() {
            out.push((format!("{name}.weight"), &linear.weight));
            if let Some(bias) = &linear.bias {
                out.push((format!("{name}.bias"), bias));
            }
        }
        out.push(("model.norm.weight".to_string(), &self.norm));
        if let Some(head) = &self.lm_head {
            out.push(("lm_head.weight".to_string(), head));
        }
        out
    }
}

/// `[batch, 1, seq, seq]` boolean: causal, keys restricted to real tokens. A padding query
/// attends to itself so that no row of the softmax is empty (an empty row would give NaN that
/// spreads through the zero-weighted values of later layers).
pub fn training_mask(attention_mask: &Tensor) -> Tensor {
    let (_, t) = attention_mask.size2().expect("attention_mask must be [batch, seq]");
    let device = attention_mask.device();
    let causal = Tensor::ones([t, t], (Kind::Bool, device)).tril(0);
    let diagonal = Tensor::eye(t, (Kind::Bool, device));
    let keys = attention_mask.to_kind(Kind::Bool).unsqueeze(1).unsqueeze(1);
    causal.logical_and(&keys.logical_or(&diagonal))
}

/// `[batch, 1, seq, seq]` boolean for packed rows: causal, and a token attends only to tokens
/// of its own document (`document_ids`, `[batch, seq]`). The diagonal is always allowed, so no
/// softmax row is empty (padding gets a document id of its own).
pub fn document_mask(document_ids: &Tensor) -> Tensor {
    let (_, t) = document_ids.size2().expect("document_ids must be [batch, seq]");
    let causal = Tensor::ones([t, t], (Kind::Bool, document_ids.device())).tril(0);
    let same_document = document_ids.unsqueeze(2).eq_tensor(&document_ids.unsqueeze(1)).unsqueeze(1);
    causal.logical_and(&same_document)
}
