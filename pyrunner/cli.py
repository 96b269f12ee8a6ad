"""cli.py — the `strata` command: a thin click group; each subcommand calls the library."""
from __future__ import annotations

import json
import sys

import click


def _fail(e: Exception) -> click.ClickException:
    return click.ClickException(str(e))


@click.group()
@click.version_option("0.1.0", prog_name="strata")
def main():
    """Strata: run qwen4exp (Qwen3.8-Flash-Next) GGUF models on one machine."""


def _short(v, limit=8):
    if isinstance(v, list):
        head = ", ".join(_short(x, limit) for x in v[:limit])
        more = f", ... ({len(v)} items)" if len(v) > limit else ""
        return f"[{head}{more}]"
    if isinstance(v, str):
        return json.dumps(v if len(v) <= 80 else v[:77] + "...", ensure_ascii=False)
    return repr(v)


def type_shares(tensors: list[dict]) -> list[tuple[str, int, float]]:
    """(type, bytes, share of all tensor bytes) per tensor type, largest first."""
    total = sum(t["size"] for t in tensors) or 1
    by = {}
    for t in tensors:
        by[t["type"]] = by.get(t["type"], 0) + t["size"]
    return sorted(((k, v, v / total) for k, v in by.items()), key=lambda r: -r[1])


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def inspect(file, as_json):
    """Show a GGUF file's metadata and tensors (name, type, shape, offset, size)."""
    from . import gguf_info
    from ._native import StrataError

    try:
        info = gguf_info(file)
    except StrataError as e:
        raise _fail(e) from None
    if as_json:
        json.dump(info, sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
        return
    md, tensors = info["metadata"], info["tensors"]
    click.echo(f"{file}: {len(md)} metadata keys, {len(tensors)} tensors")
    for k, v in md.items():
        click.echo(f"  {k} = {_short(v)}")
    click.echo(f"{'tensor':48s} {'type':8s} {'shape':24s} {'offset':>14s} {'size':>14s}")
    for t in tensors:
        shape = "x".join(str(d) for d in t["shape"])
        click.echo(f"{t['name']:48s} {t['type']:8s} {shape:24s} {t['offset']:14d} {t['size']:14d}")
    click.echo("weights by type:")
    for name, nbytes, share in type_shares(tensors):
        click.echo(f"  {name:8s} {nbytes / 2**20:12.2f} MiB {100 * share:6.2f} %")


@main.command()
@click.argument("hf_dir", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False),
              help="The GGUF file to write.")
@click.option("--outtype", type=click.Choice(["f32", "f16", "bf16", "q8_0"]), default="f32", show_default=True,
              help="Type of the matmul weights (norms, routers, 1-D tensors stay F32).")
@click.option("--tokenizer-pre", default=None,
              help="llama.cpp pre-tokenizer name, when it cannot be recognised from tokenizer.json.")
@click.option("-q", "--quiet", is_flag=True, help="Do not list the tensors as they are written.")
def convert(hf_dir, out, outtype, tokenizer_pre, quiet):
    """Convert a transformers qwen4_exp checkpoint (safetensors) to a qwen4exp GGUF."""
    from .convert import ConvertError
    from .convert import convert as run

    try:
        res = run(hf_dir, out, outtype, tokenizer_pre, log=None if quiet else click.echo)
    except (ConvertError, OSError) as e:
        raise _fail(e) from None
    shares = ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in sorted(res["types"].items(), key=lambda r: -r[1]))
    click.echo(f"wrote {out}: {res['tensors']} tensors, {res['bytes'] / 2**20:.2f} MiB ({shares})")


@main.command()
@click.argument("src", metavar="IN.gguf", type=click.Path(exists=True, dir_okay=False))
@click.argument("dst", metavar="OUT.gguf", type=click.Path(dir_okay=False))
@click.option("--recipe", required=True, type=click.Choice(["q8_0", "q4_k_m", "iq2_xs", "nvfp4"]),
              help="Type mix (see pyrunner/quantize.py for each rule and fallback).")
@click.option("--imatrix", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Importance matrix from llama-imatrix (.dat or GGUF).")
@click.option("--threads", type=int, default=None, envvar="STRATA_THREADS", help="Quantizer threads (default: all cores).")
@click.option("--nvfp4-scale", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True,
              help="Whether NVFP4 weights get a per-tensor .scale tensor.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def quantize(src, dst, recipe, imatrix, threads, nvfp4_scale, quiet):
    """Quantize a GGUF to a recipe's type mix, streaming tensor by tensor; prints the share of
    weights that got each type."""
    from .quantize import QuantizeError, format_shares, quantize_file

    try:
        res = quantize_file(src, dst, recipe, imatrix=imatrix, progress=not quiet, threads=threads,
                            nvfp4_scale=nvfp4_scale)
    except (QuantizeError, OSError) as e:
        raise _fail(e) from None
    if quiet:
        click.echo(format_shares(res))


@main.group()
def bench():
    """Benchmarks (they measure; nothing here asserts a speed)."""


@bench.command("kernels")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--types", default=None, help="Comma-separated type names (default: every supported type).")
@click.option("--threads", type=int, default=None, envvar="STRATA_THREADS", help="Threads for the all-threads runs.")
@click.option("--batches", default="1,4,512", show_default=True, help="Comma-separated batch sizes.")
def bench_kernels(as_json, types, threads, batches):
    """Matrix x vector / small batch / large batch for every block format at the real model's
    shapes, one and all threads, with a memory read-bandwidth probe from the same run."""
    from . import bench as b
    from . import quant
    from ._native import StrataError

    names = types.split(",") if types else None
    if names:
        known = set(quant.supported_types())
        bad = [n for n in names if n not in known]
        if bad:
            raise click.ClickException(f"unknown or unsupported types {bad}; supported: {sorted(known)}")
    try:
        res = b.run(types=names, threads=threads, batches=tuple(int(x) for x in batches.split(",")),
                    log=(lambda s: click.echo(s, err=True)) if as_json else click.echo)
    except StrataError as e:
        raise _fail(e) from None
    if as_json:
        json.dump(res, sys.stdout)
        sys.stdout.write("\n")


@bench.command("model")
@click.option("-m", "--model", "model_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="The GGUF model file.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--vs-llama-cpp", is_flag=True, help="Run the same file, prompt and loop through llama-cpp-python too.")
@click.option("--threads", type=int, default=2, show_default=True, help="Threads for both engines.")
@click.option("--prompt-tokens", type=int, default=512, show_default=True, help="Prefill prompt length (random ids).")
@click.option("--gen-tokens", type=int, default=128, show_default=True, help="Greedy decode steps.")
@click.option("--kv-type", type=click.Choice(["f32", "f16", "int8"]), default="f16", show_default=True,
              envvar="STRATA_KV_TYPE", help="KV cache type.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random prompt ids.")
def bench_model(model_path, as_json, vs_llama_cpp, threads, prompt_tokens, gen_tokens, kv_type, seed):
    """Prefill tokens/s over a random prompt and decode tokens/s over greedy steps (each feeds the argmax of
    the previous logits); with --vs-llama-cpp, llama.cpp on the same file in the same run, and the ratios."""
    from . import bench as b
    from ._native import StrataError

    if threads < 1:
        raise click.ClickException(f"--threads {threads}: give at least 1")
    log = (lambda s: click.echo(s, err=True)) if as_json else click.echo
    try:
        res = b.bench_model(model_path, threads=threads, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens,
                            kv_type=kv_type, vs_llama_cpp=vs_llama_cpp, seed=seed, log=log)
    except (b.BenchError, StrataError) as e:
        raise _fail(e) from None
    if as_json:
        json.dump(res, sys.stdout)
        sys.stdout.write("\n")
    else:
        click.echo(b.format_model_table(res))


if __name__ == "__main__":
    main()
