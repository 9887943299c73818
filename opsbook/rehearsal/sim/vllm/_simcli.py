"""The simulated vLLM's command line: ``vllm serve`` and the api_server module's arguments, as
the release the rehearsal host plays accepts them (``_simrelease``).

Standard library only: copied into the rehearsal host's venv with the rest of this package.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from . import _simrelease


def human_int(text: str) -> int:
    """vLLM's human_readable_int (vllm/engine/arg_utils.py): ``32768``, ``25.6k`` (x1000),
    ``32K`` (x1024, no decimals), with k/m/g/t and K/M/G/T."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text.strip())
    if not match:
        return int(text)
    number, suffix = match.groups()
    if suffix.islower():
        return int(float(number) * 10 ** (3 * "kmgt".index(suffix) + 3))
    try:
        return int(number) * 2 ** (10 * "KMGT".index(suffix) + 10)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Decimals are not allowed with binary suffixes like {suffix}. Did you mean to use "
            f"{number}{suffix.lower()} instead?"
        ) from None


def json_arg(text: str) -> Any:
    """A JSON-valued flag (``--attention-config '{"backend": "X"}'``), as vLLM parses it."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def add_server_arguments(parser: argparse.ArgumentParser, version: str) -> None:
    """The flags this simulation knows, in the order vLLM lists non-default args.

    Which flags exist follows the release played (``_simrelease``): with its facts sheet (the
    serve flags read from that release's source, frontend flags included wherever the release
    defines ``FrontendArgs``), exactly the sheet's flags -- the ones below with their types, the
    rest accepted without effect -- so a flag the release lacks fails as vLLM's own parser
    fails it (``unrecognized arguments``, exit code 2).
    """
    release = _simrelease.load(version)
    flags = release.serve_flags

    def add(*names: str, **kwargs: Any) -> None:
        if flags is not None and names[0] not in flags:
            return  # not a flag of this release (its facts sheet, from its source)
        parser.add_argument(*names, **kwargs)

    add("--enable-auto-tool-choice", action="store_true", default=False)
    add("--tool-call-parser", default=None)
    add("--host", default=None)
    add("--port", type=int, default=8000)
    add("--uvicorn-log-level", default="info")
    add("--api-key", default=None)
    add("--chat-template", default=None)
    if release.has_disable_log_requests and release.disable_log_requests_inverts:
        add(
            "--disable-log-requests",
            dest="enable_log_requests",
            action="store_false",
            default=False,
        )
    elif release.has_disable_log_requests:
        add("--disable-log-requests", action="store_true", default=False)
    add("--enable-log-requests", action="store_true", default=False)
    add("--model", default=None)
    add("--tokenizer", default=None)
    add("--trust-remote-code", action="store_true", default=False)
    add("--dtype", default="auto")
    add("--seed", type=int, default=None)
    add("--max-model-len", type=human_int, default=None)
    add("--quantization", "-q", default=None)
    add("--enforce-eager", action="store_true", default=False)
    add("--served-model-name", nargs="+", default=None)
    add("--generation-config", default="auto")
    add("--load-format", default="auto")
    add("--download-dir", default=None)
    add("--hf-token", type=str, nargs="?", const=True, default=None)
    if release.has_attention_backend_flag:
        add("--attention-backend", default=None)
    add("--reasoning-parser", default=None)
    add("--distributed-executor-backend", default=None)
    add("--pipeline-parallel-size", "-pp", type=int, default=1)
    add("--tensor-parallel-size", "-tp", type=int, default=1)
    add("--enable-expert-parallel", action="store_true", default=False)
    add("--disable-custom-all-reduce", action="store_true", default=False)
    add("--block-size", type=int, default=None)
    add("--gpu-memory-utilization", type=float, default=0.9)
    add("--kv-cache-memory-bytes", type=human_int, default=None)
    if release.kv_dtype_checked_after_load:
        add("--kv-cache-dtype", default="auto")
    else:
        add("--kv-cache-dtype", choices=release.kv_cache_dtypes, default="auto")
    add("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    add("--max-num-batched-tokens", type=human_int, default=None)
    add("--max-num-seqs", type=int, default=None)
    add("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    add("--mm-encoder-tp-mode", default="weights")
    add("--limit-mm-per-prompt", default=None)
    add("--compilation-config", "-cc", type=json_arg, default=None)
    if release.has_attention_backend_flag:
        add("--attention-config", "-ac", type=json_arg, default=None)
    # The rest of the release's flags: accepted, and without effect on the simulation.
    taken = set(parser._option_string_actions)
    for name in sorted((flags or set()) - taken):
        if name.startswith("-") and name != "--model-tag":
            parser.add_argument(name, nargs="?", const=True, default=None)


def build_parser(
    form: str, version: str
) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The top-level parser and the one holding the server flags.

    Args:
        form: ``serve`` for ``vllm serve`` (model positional), ``api_server`` for the module.
        version: the simulated version (flags come and go by version).
    """
    if form == "api_server":
        parser = argparse.ArgumentParser(
            prog="api_server.py", description="vLLM OpenAI-Compatible RESTful API server."
        )
        add_server_arguments(parser, version)
        return parser, parser
    parser = argparse.ArgumentParser(prog="vllm", description="vLLM CLI")
    parser.add_argument("-v", "--version", action="version", version=version)
    commands = parser.add_subparsers(
        dest="subparser", metavar="{chat,complete,serve,bench,collect-env,run-batch}"
    )
    serve = commands.add_parser(
        "serve",
        help="Launch a local OpenAI-compatible API server to serve LLM completions via HTTP.",
        usage="vllm serve [model_tag] [options]",
    )
    serve.add_argument("model_tag", nargs="?", default=None)
    add_server_arguments(serve, version)
    for name in ("chat", "complete", "bench", "collect-env", "run-batch"):
        commands.add_parser(name)
    return parser, serve


def normalise_flags(argv: list[str]) -> list[str]:
    """As vLLM's FlexibleArgumentParser: ``--max_model_len`` is ``--max-model-len``, and dotted
    flags (``--attention-config.backend X``) are gathered into one JSON value per flag
    (vllm/utils/argparse_utils.py)."""
    out: list[str] = []
    dotted: dict[str, dict[str, Any]] = {}
    items = list(argv)
    while items:
        item = items.pop(0)
        if item.startswith("--"):
            name, sep, value = item.partition("=")
            item = name.replace("_", "-") + sep + value
        if item.startswith("-") and "." in item.partition("=")[0]:
            name, sep, value = item.partition("=")
            if not sep:
                value = items.pop(0) if items else ""
            key, *keys = name.split(".")
            _set_nested(dotted.setdefault(key, {}), keys, json_arg(value))
            continue
        out.append(item)
    for key, value in dotted.items():
        out += [key, json.dumps(value)]
    return out


def _set_nested(target: dict[str, Any], keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    target[keys[-1]] = value


def non_default_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    return {
        key: value
        for key, value in vars(args).items()
        if key not in ("subparser",) and value != parser.get_default(key)
    }
