"""python -m minillm {generate, run, bench, train, ship, student, grade, export, serve, router}"""
from __future__ import annotations

import argparse
import sys

BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def parse_bool(value: str) -> bool:
    """true/false/1/0/yes/no, any case. Anything else is refused: `--enable-prefix-caching maybe` must not
    quietly mean False."""
    if value.lower() not in BOOLS:
        raise argparse.ArgumentTypeError(f"expected true/false/1/0/yes/no, got {value!r}")
    return BOOLS[value.lower()]


def engine_flags(ap: argparse.ArgumentParser):
    """Every EngineConfig option as --name-with-dashes (dict-valued ones take JSON)."""
    import json
    from dataclasses import MISSING, fields

    from .config import EngineConfig
    for f in fields(EngineConfig):
        if f.name == "tokenizer":
            continue
        flag, default = "--" + f.name.replace("_", "-"), f.default if f.default is not MISSING else None
        if isinstance(default, bool):
            ap.add_argument(flag, type=parse_bool, default=default, metavar="BOOL")
        elif f.name in ("quant_config", "speculative"):
            ap.add_argument(flag, type=json.loads, default=None, metavar="JSON")
        elif f.name in ("kv_cache_bytes", "max_model_len", "max_num_batched_tokens"):
            ap.add_argument(flag, type=int, default=None)
        else:
            ap.add_argument(flag, type=type(default) if default is not None else str, default=default)


def generate_main(argv: list[str]) -> int:
    from dataclasses import fields

    from .config import EngineConfig
    from .core.sampling import SamplingParams
    from .engine.llm import LLM

    ap = argparse.ArgumentParser(prog="python -m minillm generate")
    ap.add_argument("--model", required=True, help="registered name, random:<preset>, a .bin file or a HF directory")
    ap.add_argument("--prompt", action="append", required=True, help="repeat for several prompts")
    ap.add_argument("--tokenizer", default=None)
    s = ap.add_argument_group("sampling (SamplingParams)")
    for name, typ, default in [("n", int, 1), ("temperature", float, 1.0), ("top-k", int, 0), ("top-p", float, 1.0),
                               ("sampling-seed", int, None), ("max-tokens", int, 64)]:
        tip = "default 64 here (SamplingParams' own default is 16, as vLLM's)" if name == "max-tokens" else None
        s.add_argument(f"--{name}", type=typ, default=default, help=tip)
    s.add_argument("--stop", action="append", default=None)
    s.add_argument("--stop-token-ids", type=int, nargs="*", default=None)
    s.add_argument("--ignore-eos", action="store_true")
    engine_flags(ap.add_argument_group("engine (EngineConfig; --seed is the engine's)"))
    a = ap.parse_args(argv)
    params = SamplingParams(n=a.n, temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=a.sampling_seed,
                            max_tokens=a.max_tokens, stop=a.stop, stop_token_ids=a.stop_token_ids,
                            ignore_eos=a.ignore_eos)
    options = {f.name: getattr(a, f.name) for f in fields(EngineConfig) if f.name != "tokenizer"}
    llm = LLM(a.model, tokenizer=a.tokenizer, **options)
    outs = llm.generate(a.prompt, params)
    for out in outs:
        for c in out.outputs:
            print((out.prompt or "") + c.text)
    return 0


def export_main(argv: list[str]) -> int:
    """`export --hf DIR`: a model (quantized first if asked) as a Hugging Face Llama directory (formats/hf_export)."""
    import json
    import warnings

    from .formats.hf_export import check_dir, export_hf
    from .formats.loader import load
    from .quantization.quantize import quantize_model

    ap = argparse.ArgumentParser(prog="python -m minillm export")
    ap.add_argument("--hf", required=True, metavar="DIR", help="the directory to write (transformers, vLLM load it)")
    ap.add_argument("--model", default="shakespeare", help="registered name, a .bin file or a HF directory")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--quantization", default=None, help="quantize first (exported dequantized, and said so)")
    ap.add_argument("--quant-config", type=json.loads, default=None, metavar="JSON")
    ap.add_argument("--force", action="store_true", help="write into a directory that is not empty")
    a = ap.parse_args(argv)
    check_dir(a.hf, a.force)                       # a non-empty directory fails now, before the model loads
    model, tok = load(a.model, a.tokenizer)
    if a.quantization:
        model, _ = quantize_model(model, a.quantization, a.quant_config, tok)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")            # the report below says the same, once
        report = export_hf(model, a.hf, tok, force=a.force)
    print(f"wrote {report.path}: {', '.join(report.files)} ({report.dtype})")
    for note in report.notes:
        print("note: " + note)
    return 0


def serve_main(argv: list[str]) -> int:
    """`serve --model M`: the OpenAI-compatible server (minillm.serve), engine options as in generate."""
    from dataclasses import fields

    from .config import EngineConfig
    from .engine.llm import LLM
    from .serve.body_limit import MAX_BODY_BYTES
    from .serve.server import bind, serve

    ap = argparse.ArgumentParser(prog="python -m minillm serve")
    ap.add_argument("--model", required=True, help="registered name, random:<preset>, a .bin file or a HF directory")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--served-model-name", default=None, help="the name clients ask for (default: --model)")
    ap.add_argument("--data-parallel-size", type=int, default=1,
                    help="N > 1: N replica servers (processes) behind `minillm router` on --port")
    ap.add_argument("--router-policy", default="prefix_aware", help="with --data-parallel-size: how to route")
    ap.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH",
                    help="LoRA adapters served as models (a PEFT directory, or a shipped adapter's name alone); "
                         "turns on --enable-lora")
    ap.add_argument("--max-logprobs", type=int, default=20, help="the most top-k logprobs a request may ask per "
                    "token (vLLM's --max-logprobs)")
    ap.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES, help="a larger request body is a 413")
    engine_flags(ap.add_argument_group("engine (EngineConfig)"))
    a = ap.parse_args(argv)
    modules = dict(m.split("=", 1) if "=" in m else (m, m) for m in a.lora_modules)
    a.enable_lora = a.enable_lora or bool(modules)
    if a.data_parallel_size != 1:
        from .cluster.http_router import serve_replicas
        return serve_replicas(argv, a.data_parallel_size, a.router_policy, a.host, a.port)
    sock = bind(a.host, a.port)                    # a port in use fails now, before the model loads
    options = {f.name: getattr(a, f.name) for f in fields(EngineConfig) if f.name != "tokenizer"}
    llm = LLM(a.model, tokenizer=a.tokenizer, **options)
    serve(llm.engine, a.served_model_name or a.model, a.host, a.port, sock=sock, lora_modules=modules,
          max_logprobs=a.max_logprobs, max_body_bytes=a.max_body_bytes)
    return 0


COMMANDS = ("generate", "run", "bench", "train", "ship", "student", "grade", "export", "serve", "router")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        asked = bool(argv) and argv[0] in ("-h", "--help")
        print("usage: python -m minillm {generate,run,bench,train,ship,student,grade,export,serve,router} ...\n"
              "  generate  --model M --prompt P [sampling flags]   text through the engine (LLM.generate)\n"
              "  run       CKPT -z TOK -t T -p P -s SEED -n STEPS -i PROMPT   llama2.c run.c, byte for byte\n"
              "  bench     {decode,batched,peers,serve,sched,quant,gptq,sparsity,longctx,spec,guided,moe,lora}\n"
              "            [--model M] [--quick] [--json F]   (bench -h)\n"
              "  train     --preset P --out DIR [--teacher T.bin] [--resume | --force]   train or distil a model\n"
              "  ship      --target DIR --draft DIR --data DIR   evaluate runs, package them with a model card\n"
              "  student   SRC DST   notebooks with the exercise solutions removed\n"
              "  grade     DIR [--gpu] [--json]   run every exercise checker on a folder of notebooks\n"
              "  export    --hf DIR [--model M] [--quantization Q] [--force]   a Hugging Face Llama directory\n"
              "  serve     --model M [--port P] [engine flags]   an OpenAI-compatible server (streaming)\n"
              "  router    --worker URL --worker URL [--policy P] [--port P]   one server in front of serve replicas\n"
              "python -m minillm COMMAND -h   a command's flags", file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 1
    cmd, rest = argv[0], argv[1:]
    import warnings
    warnings.formatwarning = lambda message, category, *args, **kw: f"warning: {message}\n"   # one line, no source
    try:
        return _command(cmd)(rest)
    except (ValueError, FileNotFoundError, TypeError) as e:  # a user's mistake: one line, no traceback, exit 2
        print("error: " + " ".join(str(e).split("\n")), file=sys.stderr)
        return 2


def _command(cmd: str):
    """The subcommand's main(argv) -> exit code, imported only when asked for (bench pulls in a lot)."""
    if cmd == "generate":
        return generate_main
    if cmd == "export":
        return export_main
    if cmd == "serve":
        return serve_main
    if cmd == "run":
        from .engine.runc import main
    elif cmd == "bench":
        from .bench.cli import main
    elif cmd == "ship":
        from .training.ship import main
    elif cmd == "train":
        return _train
    elif cmd == "grade":
        from .labs.grade import main
    elif cmd == "router":
        from .cluster.http_router import main
    else:
        from .labs.student import main
    return main


def _train(argv: list) -> int:
    """`train`: --preset lora is minillm.training.lora's (an adapter on the frozen model); the MoE presets run in
    minillm.training.moe, which hands any other preset on to train.py's."""
    from .training.lora import wants_lora
    if wants_lora(argv):
        from .training.lora import main
    else:
        from .training.moe import main
    return main(argv)


if __name__ == "__main__":
    sys.exit(main())
