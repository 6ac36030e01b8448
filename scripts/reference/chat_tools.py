#!/usr/bin/env python3
"""Chat templates with tools as transformers renders them (issue 48).

Usage (from the repo root):
    .venv/bin/python scripts/reference/chat_tools.py TOKENIZER_DIR CASES_JSON OUT_JSON TEMPLATE.jinja...

CASES_JSON: {"cases": [{"messages": [...], "tools": [...] or null, "add_generation_prompt": bool}, ...]}
read with json.load, so every dict keeps its keys in the order the file wrote them, as a caller's
literal dicts do. OUT_JSON: {"rendered": [[text of case c under template t for c] for t]}, each
`tokenizer.apply_chat_template(messages, tools=tools, chat_template=<the file's text>,
tokenize=False, add_generation_prompt=...)` with TOKENIZER_DIR's tokenizer (only its special
tokens reach the template).
"""

import json
import sys

from transformers import AutoTokenizer


def main() -> None:
    tokenizer_dir, cases_path, out_path, *template_paths = sys.argv[1:]
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    with open(cases_path, encoding="utf-8") as f:
        spec = json.load(f)
    rendered = []
    for template_path in template_paths:
        with open(template_path, encoding="utf-8") as f:
            template = f.read()
        rendered.append([
            tokenizer.apply_chat_template(
                case["messages"],
                tools=case["tools"],
                chat_template=template,
                tokenize=False,
                add_generation_prompt=case["add_generation_prompt"],
            )
            for case in spec["cases"]
        ])
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"rendered": rendered}, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
