#!/usr/bin/env python3
"""Episodes in the model's chat template (issue 48): a tiny model with SmolLM2's tokenizer and
template, and transformers' tokenization of an episode's conversation.

Usage (from the repo root):
    .venv/bin/python scripts/reference/chat_episode.py model OUT_DIR
    .venv/bin/python scripts/reference/chat_episode.py render EPISODES_JSON OUT_JSON
    .venv/bin/python scripts/reference/chat_episode.py tool-model OUT_DIR CALL_TEXT TEMPLATE
    .venv/bin/python scripts/reference/chat_episode.py render-tools CASE_JSON OUT_JSON MODEL_DIR

model: a random LlamaForCausalLM (2 layers, hidden 64, vocab 49152, untied head, fp32) saved in
OUT_DIR with .fixtures/smollm2-135m-instruct's tokenizer.json, tokenizer_config.json and
chat_template.jinja. Its head writes only WORDS and <|im_end|>: their rows are random with a
large weight on hidden dimension 0, which every token's embedding carries (3.0, the rest
N(0, 0.1); the blocks' outputs are small), every other row is 0. So a sampled turn is a few of
these words, which the tokenizer writes back as the same ids (each word a token of its own after
a space), and the whole sequence is comparable with a tokenization of its text.

render: EPISODES_JSON is {"episodes": [{"messages": [...], "ended": [bool per assistant
message]}, ...]}; for each, the text of `apply_chat_template(messages)` up to the end of its last
assistant message's content (and its <|im_end|> when that turn ended with it), its ids
(`tokenizer(text, add_special_tokens=False)`, as `apply_chat_template(..., tokenize=True)`), and
the assistant mask: 1 on the tokens inside each assistant message's content and, for a turn
that ended with it, its <|im_end|> (found by rendering the messages before it with the
generation prompt), 0 elsewhere. OUT_JSON: {"ids": [[...]], "mask": [[...]], "texts": [...]}.

tool-model (contract 0.6's tool calls): the same architecture, SmolLM2's tokenizer with one added
(non-special) token whose text is CALL_TEXT (a whole `<tool_call>` block) and TEMPLATE (a chat
template with a tool-call format, TRL's qwen2_5.jinja) as chat_template.jinja. Its head writes
only two tokens: the call after "\n" (the generation prompt's last token) and <|im_end|> after
the call: each token's embedding carries 3.0 on a dimension of its own (1 for "\n", 2 for the
call), the head's two rows 8.0 there, every other row 0. So every turn is the call, then
<|im_end|>, whatever the sampler's seed.

render-tools: CASE_JSON is {"messages": [...], "tools": [...], "tests": [{"name", "literal"}]};
writes {"prompt": apply_chat_template(messages[:1], tools=tools, add_generation_prompt=True),
"conversation": apply_chat_template(messages, tools=tools) (tokenize=False both),
"reports": [...]}: each tests literal as code_tests_episode's `read_tests` says it (its
"read_tests: the grader's N tests:" line, then one `name(ARG) == EXPECTED` a line, the values as
Python's repr writes them, read with ast.literal_eval).
"""

import ast
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = REPO_ROOT / ".fixtures" / "smollm2-135m-instruct"
WORDS = [" yes", " no", " maybe", " higher", " lower"]
END = "<|im_end|>"


def tiny_llama(vocab_size: int, positions: int) -> LlamaForCausalLM:
    """The random 2-layer Llama both modes start from (seed 0)."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions, rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=2, initializer_range=0.02,
    )
    return LlamaForCausalLM(config).eval()


def model(out_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    ids = [tokenizer.encode(w, add_special_tokens=False) for w in WORDS + [END]]
    assert all(len(i) == 1 for i in ids), ids
    net = tiny_llama(len(tokenizer), 512)
    with torch.no_grad():
        embed = net.model.embed_tokens.weight
        embed.normal_(0.0, 0.1)
        embed[:, 0] = 3.0
        head = net.lm_head.weight
        head.zero_()
        for [i] in ids:
            head[i].normal_(0.0, 1.0)
            head[i, 0] = 4.0
    net.save_pretrained(out_dir, safe_serialization=True)
    for name in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]:
        shutil.copy(SMOLLM2 / name, out_dir / name)


def render(episodes_path: str, out_path: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    with open(episodes_path, encoding="utf-8") as f:
        episodes = json.load(f)["episodes"]
    out = {"ids": [], "mask": [], "texts": []}
    for episode in episodes:
        messages, ended = episode["messages"], episode["ended"]
        full = tokenizer.apply_chat_template(messages, tokenize=False)
        spans = []
        assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        assert len(assistant) == len(ended) and assistant[-1] == len(messages) - 1
        for i, stopped in zip(assistant, ended):
            start = len(tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True))
            content = messages[i]["content"]
            assert full[start:start + len(content)] == content
            end = start + len(content)
            if stopped:
                assert full[end:end + len(END)] == END
                end += len(END)
            spans.append((start, end))
        text = full[:spans[-1][1]]
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        mask = [int(any(s <= a and b <= e for s, e in spans)) for a, b in encoded["offset_mapping"]]
        out["ids"].append(encoded["input_ids"])
        out["mask"].append(mask)
        out["texts"].append(text)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f)


def tool_model(out_dir: Path, call_text: str, template: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_json = json.loads((SMOLLM2 / "tokenizer.json").read_text(encoding="utf-8"))
    call_id = len(tokenizer_json["model"]["vocab"]) + sum(1 for t in tokenizer_json["added_tokens"] if t["id"] >= len(tokenizer_json["model"]["vocab"]))
    tokenizer_json["added_tokens"].append({"id": call_id, "content": call_text, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": False})
    (out_dir / "tokenizer.json").write_text(json.dumps(tokenizer_json, ensure_ascii=False), encoding="utf-8")
    shutil.copy(SMOLLM2 / "tokenizer_config.json", out_dir / "tokenizer_config.json")
    shutil.copy(template, out_dir / "chat_template.jinja")
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    assert tokenizer.encode(call_text, add_special_tokens=False) == [call_id], tokenizer.encode(call_text, add_special_tokens=False)
    [newline] = tokenizer.encode("\n", add_special_tokens=False)
    [end] = tokenizer.encode(END, add_special_tokens=False)
    net = tiny_llama(len(tokenizer), 2048)
    with torch.no_grad():
        embed = net.model.embed_tokens.weight
        embed.normal_(0.0, 0.1)
        embed[newline, 1] = 3.0
        embed[call_id, 2] = 3.0
        head = net.lm_head.weight
        head.zero_()
        head[call_id, 1] = 8.0
        head[end, 2] = 8.0
    net.save_pretrained(out_dir, safe_serialization=True)


def read_report(name: str, literal: str) -> str:
    tests = ast.literal_eval(literal)
    lines = [f"{name}({', '.join(repr(a) for a in args)}) == {expected!r}" for args, expected in tests]
    return f"read_tests: the grader's {len(tests)} tests:\n" + "\n".join(lines)


def render_tools(case_path: str, out_path: str, model_dir: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with open(case_path, encoding="utf-8") as f:
        case = json.load(f)
    messages, tools = case["messages"], case["tools"]
    out = {
        "prompt": tokenizer.apply_chat_template(messages[:1], tools=tools, tokenize=False, add_generation_prompt=True),
        "conversation": tokenizer.apply_chat_template(messages, tools=tools, tokenize=False),
        "reports": [read_report(t["name"], t["literal"]) for t in case["tests"]],
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    if sys.argv[1] == "model":
        model(Path(sys.argv[2]))
    elif sys.argv[1] == "render":
        render(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "tool-model":
        tool_model(Path(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "render-tools":
        render_tools(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(f"unknown mode {sys.argv[1]}")
