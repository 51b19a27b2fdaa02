#!/usr/bin/env python3
"""Renders tests/openai/templates/*.jinja with Python's jinja2 in the
environment transformers uses for chat templates, and writes
template_goldens.json, which jinja_test.cc compares our interpreter with.
The goldens are committed, so the tests need no Python; rerun this after
changing a template, with any Python that has jinja2 (3.1 made these):
  python3 tests/openai/make_template_goldens.py
"""
import json
import os

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))

CONVERSATIONS = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "Hi there"},
     {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke."}],
    [{"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
     {"role": "user", "content": "and 3+3?"}],
    # Roles that do not alternate: Mistral's template raises.
    [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
]


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    cases = []
    for name in sorted(os.listdir(os.path.join(HERE, "templates"))):
        with open(os.path.join(HERE, "templates", name), encoding="utf-8") as f:
            template = env.from_string(f.read())
        for i, conv in enumerate(CONVERSATIONS):
            for agp in (True, False):
                for extra in ({}, {"enable_thinking": False}):
                    if extra and name != "qwen3.jinja":
                        continue
                    case = {"template": name, "messages": conv,
                            "add_generation_prompt": agp, "extra": extra}
                    try:
                        case["output"] = template.render(
                            messages=conv, add_generation_prompt=agp,
                            bos_token="<s>", eos_token="</s>", **extra)
                    except jinja2.exceptions.TemplateError as e:
                        case["error"] = str(e)
                    cases.append(case)
    with open(os.path.join(HERE, "template_goldens.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(cases)} cases")


if __name__ == "__main__":
    main()
