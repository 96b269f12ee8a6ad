"""cli.py — the `strata` command: a thin click group; each subcommand calls the library."""
from __future__ import annotations

import json
import math
import sys

import click


def _fail(e: Exception) -> click.ClickException:
    return click.ClickException(str(e))



def _mtp_flag(ctx, param, value):
    """--mtp: 'auto' or a draft count >= 0."""
    if value is None:
        return None
    from .mtp import parse_mtp

    try:
        return parse_mtp(value, "--mtp")
    except ValueError as e:
        raise click.BadParameter(str(e)) from None

@click.group()
@click.version_option("0.1.0", prog_name="strata")
def main():
    """Strata: run qwen4exp (Qwen3.8-Flash-Next) GGUF models on one machine."""
    from ._native import check_settings

    try:
        check_settings()   # a bad STRATA_ISA / STRATA_GEMM: one line naming the variable, before any command
    except ValueError as e:
        raise click.ClickException(str(e)) from None


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
@click.argument("file", type=click.Path(exists=True, dir_okay=False), required=False, envvar="STRATA_MODEL")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def inspect(file, as_json):
    """Show a GGUF file's metadata and tensors (name, type, shape, offset, size); without FILE, the
    model `strata generate` runs without -m (STRATA_MODEL, else the default model)."""
    from . import gguf_info
    from ._native import StrataError
    from .models import MakeModelError, default_model

    try:
        if file is None:
            file, notice = default_model(log=lambda s: click.echo(s, err=True))
            click.echo(notice, err=True)
        info = gguf_info(file)
    except (MakeModelError, StrataError, OSError) as e:
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
@click.option("--cflags", is_flag=True, help="Compiler flags: -I<the folder of strata.h>.")
@click.option("--libs", is_flag=True, help="Linker flags: -L<folder> -lstrata -Wl,-rpath,<folder> -lpthread.")
@click.option("--prefix", is_flag=True, help="The installed folder holding libstrata.so and strata.h.")
@click.option("--pkg-config", "pkg_config", is_flag=True, help="Print a pkg-config file (strata.pc) for this install.")
@click.option("--pkg-config-dir", type=click.Path(file_okay=False), default=None,
              help="Write strata.pc into this folder, for PKG_CONFIG_PATH=DIR pkg-config --cflags --libs strata.")
def config(cflags, libs, prefix, pkg_config, pkg_config_dir):
    """How a C program builds against this installed Strata, without a source checkout:
    `cc prog.c $(strata config --cflags --libs) -o prog` (no option: --cflags --libs). The rpath lets
    the program find libstrata.so where pip put it, with no LD_LIBRARY_PATH."""
    from pathlib import Path

    from . import __version__

    pkg = Path(__file__).resolve().parent        # setup.py puts libstrata.so and strata.h next to this file
    missing = [n for n in ("libstrata.so", "strata.h") if not (pkg / n).is_file()]
    if missing:
        raise click.ClickException(f"{' and '.join(missing)} not found in {pkg}: this Strata was installed "
                                   "without its native library; reinstall it (pip install . in the source tree)")
    if " " in str(pkg):
        raise click.ClickException(f"{pkg} has a space in it, which compiler flags cannot carry unquoted; "
                                   "install Strata under a path without spaces")
    inc = f"-I{pkg}"
    lib = f"-L{pkg} -lstrata -Wl,-rpath,{pkg} -lpthread"
    if pkg_config or pkg_config_dir:
        pc = (f"prefix={pkg}\nincludedir=${{prefix}}\nlibdir=${{prefix}}\n\nName: strata\n"
              f"Description: Strata, a GGUF runner for qwen4exp models (libstrata)\nVersion: {__version__}\n"
              "Cflags: -I${includedir}\nLibs: -L${libdir} -lstrata -Wl,-rpath,${libdir} -lpthread\n")
        if pkg_config_dir is None:
            click.echo(pc, nl=False)
            return
        out = Path(pkg_config_dir) / "strata.pc"
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(pc)
        except OSError as e:
            raise click.ClickException(f"--pkg-config-dir {pkg_config_dir}: cannot write strata.pc there "
                                       f"({e.strerror or e})") from None
        click.echo(f"wrote {out}; use it with PKG_CONFIG_PATH={out.parent} pkg-config --cflags --libs strata",
                   err=True)
        return
    if not (cflags or libs or prefix):
        cflags = libs = True
    click.echo(" ".join(v for on, v in ((prefix, str(pkg)), (cflags, inc), (libs, lib)) if on))


@main.command()
@click.argument("hf_dir", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False),
              help="The GGUF file to write.")
@click.option("--outtype", type=click.Choice(["f32", "f16", "bf16", "q8_0"]), default="f32", show_default=True,
              help="Type of the matmul weights (norms, routers, 1-D tensors stay F32).")
@click.option("--tokenizer-pre", default=None,
              help="llama.cpp pre-tokenizer name, when it cannot be recognised from tokenizer.json.")
@click.option("--ple-external", type=click.Path(exists=True), default=None,
              help="A `strata pack-ple` output of this checkpoint: the GGUF names it instead of holding the PLE table.")
@click.option("--no-mtp", is_flag=True,
              help="Drop the checkpoint's MTP head (mtp.*): the file holds the trunk alone, as llama.cpp without "
                   "qwen4exp MTP support loads it.")
@click.option("-q", "--quiet", is_flag=True, help="Do not list the tensors as they are written.")
def convert(hf_dir, out, outtype, tokenizer_pre, ple_external, no_mtp, quiet):
    """Convert a transformers qwen4_exp checkpoint (safetensors) to a qwen4exp GGUF."""
    from .convert import ConvertError
    from .convert import convert as run

    try:
        res = run(hf_dir, out, outtype, tokenizer_pre, log=None if quiet else click.echo, ple_external=ple_external,
                  mtp=not no_mtp)
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


@main.command("pack-ple")
@click.argument("checkpoint_dir", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory for ple_nvfp4.bin and its .json sidecar.")
@click.option("-q", "--quiet", is_flag=True, help="Do not list the shards as they are packed.")
def pack_ple(checkpoint_dir, out_dir, quiet):
    """Pack a ModelOpt NVFP4 checkpoint's PLE table into one file of fixed rows (DESIGN §6); then
    `strata convert CHECKPOINT_DIR -o M.gguf --ple-external OUT_DIR`."""
    from .ple import PleError, pack_ple as run

    try:
        res = run(checkpoint_dir, out_dir, log=None if quiet else click.echo)
    except (PleError, OSError) as e:
        raise _fail(e) from None
    click.echo(f"wrote {res['path']}: {res['total_rows']} rows x {res['row_width']} bytes "
               f"({res['file_bytes'] / 2**20:.2f} MiB) from {res['num_shards']} shards; source {res['source']}")


@main.group()
def bench():
    """Benchmarks (they measure; nothing here asserts a speed)."""


def _kernel_path(ctx, param, value):
    """--isa: a kernel path this machine runs (click option callback)."""
    from ._native import ISA_NAMES, isa_paths

    if value is not None and value not in isa_paths():
        what = "this CPU, its OS or this build cannot run it" if value in ISA_NAMES else "not a kernel path"
        raise click.BadParameter(f"{value!r}: {what}; this machine runs {', '.join(isa_paths())}")
    return value


@bench.command("kernels")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--types", default=None, help="Comma-separated type names (default: every supported type).")
@click.option("--threads", type=int, default=None, envvar="STRATA_THREADS", help="Threads for the all-threads runs.")
@click.option("--batches", default="1,4,512", show_default=True, help="Comma-separated batch sizes.")
@click.option("--isa", default=None, callback=_kernel_path,
              help="Kernel path to measure, one this machine runs (default: the best, or the one STRATA_ISA names).")
def bench_kernels(as_json, types, threads, batches, isa):
    """Matrix x vector / small batch / large batch for every block format at the real model's
    shapes, one and all threads, on one kernel path, with the two bounds measured in the same run:
    memory read bandwidth and the path's int8 multiply-accumulate peak. Each row gives its share of
    both and which bound holds (the larger share)."""
    from . import bench as b
    from . import quant
    from ._native import StrataError

    names = [n.strip().upper() for n in types.split(",")] if types else None    # q8_0 as the recipes spell it
    if names:
        known = set(quant.supported_types())
        bad = [n for n in names if n not in known]
        if bad:
            raise click.ClickException(f"unknown or unsupported types {bad}; supported: {sorted(known)}")
    try:
        res = b.run(types=names, threads=threads, batches=tuple(int(x) for x in batches.split(",")), isa=isa,
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
@click.option("--mtp", type=str, default="0", show_default=True, callback=_mtp_flag,
              help="K > 0: decode with K MTP drafts per window next to decode without, at forced acceptance rates; "
                   "auto: --mtp auto next to every fixed k, also on a schedule switching the acceptance.")
@click.option("--mtp-max", type=click.IntRange(min=1), default=3, show_default=True,
              help="With --mtp auto: the most drafts it tries, and the fixed k it is compared with (0..this).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also run the benchmark once more with the timeline recorder on, write that run's trace, and "
                   "report the recorder's cost (tokens/s with and without it).")
@click.option("--repack/--no-repack", default=None, envvar="STRATA_REPACK",
              help="Strata's prefill conversion of IQ weight rows (see `strata generate --help`) [default: on].")
@click.option("--mem-limit-gib", type=float, default=None,
              help="Run each engine in its own child process under its own memory cgroup of this many GiB (page "
                   "cache included; needs root), the file evicted from the page cache first: Strata without a "
                   "limit, Strata with --expert-io under it, Strata mmap under it, and llama.cpp under it with "
                   "--vs-llama-cpp.")
@click.option("--expert-io", type=click.Choice(["auto", "mmap", "direct"]), default=None,
              help="How Strata reads routed experts [default: auto; with --mem-limit-gib: direct].")
@click.option("--ram-gib", type=float, default=None,
              help="RAM slots for experts read directly [default: what the memory allowed leaves].")
@click.option("--split-compare", is_flag=True,
              help="The per-layer online split against the seed's controller on --device (default sim), side by "
                   "side in --rounds rounds: decode tok/s, the shares, the ratio per round.")
@click.option("--device", type=click.Choice(["sim", "cuda"]), default="sim", show_default=True,
              help="With --split-compare: the device.")
@click.option("--cache-gib", type=float, default=None, help="With --split-compare: device expert cache, GiB.")
@click.option("--rounds", type=int, default=None,
              help="With --split-compare: rounds of seed, online [default: 2]. With --mtp auto: rounds of every row, "
                   "auto first and last in turn [default: 1].")
@click.option("--mtp-rates", type=str, default=None, callback=lambda c, p, v: _rates(v),
              help="With --mtp auto: the forced acceptance rates, comma-separated [default: 0,0.25,0.5,0.75,0.9,1].")
@click.option("--mtp-rows", type=str, default=None,
              callback=lambda c, p, v: None if v is None else tuple(r.strip() for r in v.split(",") if r.strip()),
              help="With --mtp auto: which rows to run, comma-separated, of natural (the head's own drafts), forced "
                   "(the --mtp-rates) and switching (the schedule) [default: all three].")
def bench_model(model_path, as_json, vs_llama_cpp, threads, prompt_tokens, gen_tokens, kv_type, seed, mtp,
                mtp_max, trace_path, repack, mem_limit_gib, expert_io, ram_gib, split_compare, device, cache_gib,
                rounds, mtp_rates, mtp_rows):
    """Prefill tokens/s over a random prompt and decode tokens/s over greedy steps (each feeds the argmax of
    the previous logits); with --vs-llama-cpp, llama.cpp on the same file in the same run (in a child process:
    if llama.cpp crashes, Strata's figures are printed, then the crash on stderr, and the exit status is 1), and
    the ratios. With --mtp K: decode with K drafts per verify window against decode without, in one run: tokens/s,
    acceptance, mean accepted length and the cost per window of drafting, verifying and rolling back, with
    the head's own drafts and with drafts forced right at rates 0..1 (random weights make the head's own
    acceptance meaningless), and the break-even acceptance."""
    from . import bench as b
    from ._native import StrataError

    if threads < 1:
        raise click.ClickException(f"--threads {threads}: give at least 1")
    log = (lambda s: click.echo(s, err=True)) if as_json else click.echo
    if mtp:
        if vs_llama_cpp:
            raise click.ClickException("--mtp and --vs-llama-cpp: llama-cpp-python 0.3.36 has no qwen4exp MTP; "
                                       "run them separately")
        tracer = _tracer({"trace_path": trace_path})    # --mtp: the one run is traced (no on/off comparison)
        try:
            with tracer:
                if mtp == "auto":
                    res = b.bench_mtp_auto(model_path, mtp_max, threads=threads, prompt_tokens=prompt_tokens,
                                           gen_tokens=gen_tokens, kv_type=kv_type, seed=seed, log=log,
                                           rounds=rounds or 1, rates=mtp_rates or b.MTP_RATES,
                                           rows=b.MTP_AUTO_ROWS if mtp_rows is None else mtp_rows)
                else:
                    res = b.bench_mtp(model_path, mtp, threads=threads, prompt_tokens=prompt_tokens,
                                      gen_tokens=gen_tokens, kv_type=kv_type, seed=seed, log=log)
        except (b.BenchError, StrataError) as e:
            raise _fail(e) from None
        _bench_out(res, as_json, b.format_mtp_auto_table if mtp == "auto" else b.format_mtp_table)
        _trace_note(tracer)
        return
    if split_compare:
        try:
            res = b.bench_split(model_path, device=device, cache_gib=cache_gib, threads=threads,
                                prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, rounds=rounds or 2, seed=seed,
                                log=log)
        except (b.BenchError, StrataError) as e:
            raise _fail(e) from None
        _bench_out(res, as_json, b.format_split_table)
        return
    if mem_limit_gib is not None:
        if mtp or trace_path:
            raise click.ClickException("--mem-limit-gib runs without --mtp and --trace")
        try:
            res = b.bench_model_limited(model_path, mem_limit_gib, threads=threads, prompt_tokens=prompt_tokens,
                                        gen_tokens=gen_tokens, kv_type=kv_type, vs_llama_cpp=vs_llama_cpp, seed=seed,
                                        expert_io=expert_io or "direct", ram_gib=ram_gib, log=log)
        except (b.BenchError, StrataError) as e:
            raise _fail(e) from None
        _bench_out(res, as_json, b.format_limited_table)
        return
    try:
        res = b.bench_model(model_path, threads=threads, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens,
                            kv_type=kv_type, vs_llama_cpp=vs_llama_cpp, seed=seed, log=log, repack=repack,
                            expert_io=expert_io or "auto", ram_gib=ram_gib)
        if trace_path:
            res["trace"] = _bench_traced(trace_path, res, lambda: b.bench_model(
                model_path, threads=threads, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, kv_type=kv_type,
                seed=seed, log=log, repack=repack))
    except (b.BenchError, StrataError) as e:
        raise _fail(e) from None
    _bench_out(res, as_json, b.format_model_table)
    if trace_path:
        t = res["trace"]
        click.echo(f"trace: {t['events']} events in {trace_path}; recorder on: prefill {t['prefill_tps']:.2f} tok/s, "
                   f"decode {t['decode_tps']:.2f} tok/s (off: {res['strata']['prefill_tps']:.2f}, "
                   f"{res['strata']['decode_tps']:.2f}; decode overhead {t['decode_overhead_pct']:+.1f} %)", err=True)
    if "error" in res.get("llama_cpp", {}):
        # after Strata's figures, which stand; exit 1 so that a script does not take the comparison as made
        raise click.ClickException(res["llama_cpp"]["error"])


def _bench_traced(path: str, res: dict, run) -> dict:
    """Runs the benchmark again with the recorder on; its rates and overhead against the untraced run
    (also written into the trace's metadata)."""
    from .trace import Tracer

    with Tracer(path) as tr:
        tr.request_begin(label="bench model")
        on = run()["strata"]
        tr.request_end()
        off = res["strata"]
        out = {"prefill_tps": on["prefill_tps"], "decode_tps": on["decode_tps"],
               "prefill_overhead_pct": 100 * (off["prefill_tps"] / on["prefill_tps"] - 1) if on["prefill_tps"] else None,
               "decode_overhead_pct": 100 * (off["decode_tps"] / on["decode_tps"] - 1) if on["decode_tps"] else None}
        tr.meta["overhead"] = dict(out, prefill_tps_off=off["prefill_tps"], decode_tps_off=off["decode_tps"])
    out["events"] = tr.meta["events"]
    return out


def _rates(value):
    """--mtp-rates: forced acceptance rates in [0, 1], comma-separated (None: the default set)."""
    if value is None:
        return None
    try:
        rates = [float(x) for x in value.split(",") if x.strip()]
    except ValueError:
        rates = []
    if not rates or any(not 0.0 <= r <= 1.0 for r in rates):
        raise click.BadParameter(f"{value!r}: give rates in [0, 1] separated by commas, e.g. 0,0.5,0.9")
    return rates


def _bench_out(res: dict, as_json: bool, table) -> None:
    """A benchmark's result: JSON on stdout, or its table."""
    if as_json:
        json.dump(res, sys.stdout)
        sys.stdout.write("\n")
    else:
        click.echo(table(res))


@bench.command("serve")
@click.option("-m", "--model", "model_path", required=True, type=click.Path(exists=True, dir_okay=False),
              envvar="STRATA_MODEL", help="The GGUF to serve.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--threads", type=int, default=2, show_default=True, help="Engine threads.")
@click.option("--device", type=click.Choice(["cpu", "sim", "cuda"]), default="cpu", show_default=True)
@click.option("--cache-gib", type=float, default=None, help="Device expert cache (sim / cuda).")
@click.option("--concurrency", default="1,2,4,8,16", show_default=True, help="Comma-separated sequence counts.")
@click.option("--gen-tokens", type=int, default=64, show_default=True, help="Tokens each request generates.")
@click.option("--prompt-tokens", type=int, default=16, show_default=True, help="Prompt of each decoding request.")
@click.option("--long-prompt", type=int, default=3000, show_default=True,
              help="Prompt prefilled beside the decoders in the mixed runs (0, or more than n_ctx: no mixed runs).")
@click.option("--batch-requests", type=int, default=64, show_default=True,
              help="Requests of the file-style batch run (0: skip it).")
@click.option("--batch-tokens", type=int, default=256, show_default=True, help="Tokens each of them generates.")
@click.option("--batch-parallel", type=int, default=8, show_default=True, help="Its parallel run's sequences.")
@click.option("--batch-rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Rounds of the batch run, alternating which goes first; the ratio is their median.")
@click.option("--prefill-chunk", type=click.IntRange(min=1, max=512), default=512, show_default=True,
              help="Prompt tokens a request evaluates per step at most (pieces of any length keep the output "
                   "`strata generate`'s); as strata serve.")
@click.option("--token-budget", type=click.IntRange(min=1), default=None,
              help="Tokens per step, decode tokens first, prompt pieces from the rest [default: --prefill-chunk].")
@click.option("--itl-factor", type=float, default=2.0, show_default=True,
              help="While requests decode, size prompt pieces from live costs so a step takes about this many times "
                   "a decode-only step, as `strata serve --itl-factor` (0: the budget alone).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random prompts.")
def bench_serve(model_path, as_json, threads, device, cache_gib, concurrency, gen_tokens, prompt_tokens, long_prompt,
                batch_requests, batch_tokens, batch_parallel, batch_rounds, prefill_chunk, token_budget, itl_factor,
                seed):
    """Continuous batching under 1..16 concurrent sequences: generated tokens/s, time to first token,
    inter-token p50/p99 (decode only, and beside a long prompt's prefill), expert bytes read per
    generated token; and a file-style batch at --parallel 1 vs N (pyrunner/bench_serve.py)."""
    from ._native import StrataError
    from . import bench_serve as bs
    from .model import Model

    try:
        conc = tuple(int(x) for x in concurrency.split(","))
    except ValueError:
        raise click.ClickException(f"--concurrency {concurrency!r}: give comma-separated counts, e.g. 1,2,4") from None
    try:
        with Model(model_path, threads=threads, device=device, cache_gib=cache_gib) as m:
            res = bs.run(m, conc, gen_tokens, prompt_tokens, long_prompt, batch_requests, batch_tokens,
                         batch_parallel, seed, progress=None if as_json else
                         (lambda r: click.echo(f"  {r['concurrency']} {r['mode']}: {r['generated_tps']:.1f} tok/s",
                                               err=True)), prefill_chunk=prefill_chunk, token_budget=token_budget,
                         itl_factor=itl_factor or None, batch_rounds=batch_rounds)
    except (StrataError, ValueError) as e:
        raise _fail(e) from None
    click.echo(json.dumps(res, indent=1) if as_json else bs.table(res))


@bench.command("ple")
@click.option("-m", "--model", "model_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="A GGUF with a PLE table, ideally larger than RAM can keep cached (models/ple-5g.json).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--threads", type=int, default=2, show_default=True, help="Engine threads.")
@click.option("--decode-tokens", type=int, default=32, show_default=True, help="Cold decode steps per setting.")
@click.option("--prompt-tokens", type=int, default=2048, show_default=True, help="Cold prefill length.")
@click.option("--gather-tokens", type=int, default=18, show_default=True,
              help="Tokens of the small cold gather (16 rows each).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random token ids.")
@click.option("--ple-cache-mib", "cache_mib", type=click.FloatRange(min=0), default=64.0, show_default=True,
              help="Row cache budget of the floor section (measured next to the cache off).")
@click.option("--corpus", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Real text for the row cache's hit rate and the decoded ids: a .txt (the model's tokenizer) or "
                   "a .npy of token ids (tools/ple_corpus.py writes flash-small's held-out split as both).")
@click.option("--corpus-budgets", default="1,8,64", show_default=True, help="Row cache budgets (MiB) of the corpus runs.")
def bench_ple(model_path, as_json, threads, decode_tokens, prompt_tokens, gather_tokens, seed, cache_mib, corpus,
              corpus_budgets):
    """Cold PLE table I/O: decode KiB read per token with default readahead vs MADV_RANDOM vs direct pread,
    prefill gather time with and without WILLNEED prefetch, decode tokens/s per mode (pyrunner/bench.py)."""
    from . import bench as b
    from ._native import StrataError

    if min(threads, decode_tokens, prompt_tokens, gather_tokens) < 1:
        raise click.ClickException("--threads, --decode-tokens, --prompt-tokens and --gather-tokens must be >= 1")
    try:
        budgets = tuple(float(x) for x in corpus_budgets.split(",") if x.strip())
    except ValueError:
        raise click.ClickException(f"--corpus-budgets {corpus_budgets!r}: give MiB values separated by commas") from None
    log = (lambda s: click.echo(s, err=True)) if as_json else click.echo
    try:
        res = b.bench_ple(model_path, threads=threads, decode_tokens=decode_tokens, prompt_tokens=prompt_tokens,
                          gather_tokens=gather_tokens, seed=seed, log=log, cache_mib=cache_mib, corpus=corpus,
                          corpus_budgets=budgets)
    except (b.BenchError, StrataError) as e:
        raise _fail(e) from None
    _bench_out(res, as_json, b.format_ple_table)


# ------------------------------------------------------------------ generate, chat, batch

from .sampling import click_options as sampling_options  # noqa: E402  (the sampling flags, DESIGN §9)


def _engine_options(f):
    """-m and the engine flags (DESIGN §9) shared by generate, chat and batch; a flag left unset is not
    passed, so pyrunner.Model's own default applies."""
    opts = [
        click.option("-m", "--model", "model_path", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="The GGUF model file (default: the shipped flash-small model, models/flash-small/)."),
        click.option("-t", "--threads", type=int, default=None, help="CPU threads (default: one per core)."),
        # -c/--ctx-size are llama.cpp's names; the variable keeps the DESIGN §9 name STRATA_N_CTX
        click.option("-c", "--n-ctx", "--ctx-size", "n_ctx", type=int, default=None, envvar="STRATA_N_CTX",
                     show_envvar=True,
                     help="Context length in tokens [default: the model's trained context, its "
                          "<arch>.context_length, at most 32768; more than trained warns]."),
        click.option("--kv-type", type=click.Choice(["f32", "f16", "int8"]), default=None,
                     help="KV cache type [default: f16]."),
        click.option("--device", type=click.Choice(["cpu", "sim", "cuda"]), default=None, help="Where experts run [default: cpu]."),
        click.option("--cache-gib", type=float, default=None,
                     help="Expert cache size on the device, GiB [default: with the dense forward on the GPU, what is "
                          "left of it (printed at start); else none]."),
        click.option("--dense", type=click.Choice(["auto", "cpu", "device", "emu"]), default=None,
                     help="Where the dense forward runs: the GPU (device), the CPU, or emu (the GPU's kernels "
                          "emulated on the host: slow, for tests) [default: auto, the GPU with --device cuda]."),
        click.option("--vram-gib", type=float, default=None,
                     help="GPU memory Strata may use in all, GiB (dense weights, state, work buffers, expert "
                          "cache) [default: what is free]."),
        click.option("--prefill-f16", is_flag=True, default=None,
                     help="Prefill products on the GPU through cuBLAS on f16 tiles (tensor cores): faster, but a "
                          "row's sums depend on the rows beside it [default: off, batch-invariant]."),
        click.option("--pcie-frac", type=float, default=None, help="Share of missing experts copied to the device."),
        click.option("--split", type=click.Choice(["seed", "online"]), default=None,
                     help="How that share is chosen: online (one per MoE layer, from live costs, every decode "
                          "window) or seed (one share from the link probe, three updates) [default: online; seed "
                          "with --pcie-frac, which then stays fixed]."),
        click.option("--sim-link-gbps", type=float, default=None,
                     help="Link bandwidth of the sim device, GB/s [default: 16]."),
        click.option("--trace-routing", type=click.Path(dir_okay=False, writable=True), default=None,
                     help="Write every MoE layer's routing as JSON lines (replay with `strata cache-sim`)."),
        click.option("--prefill-chunk", type=int, default=None, help="Prefill chunk, tokens [default: 8192]."),
        click.option("--mtp", type=str, default=None, callback=_mtp_flag,
                     help="Tokens drafted per verify window by the MTP head: a count (0 = off) or 'auto', chosen "
                          "window by window from measured costs and acceptance [default: auto when the model has "
                          "an MTP head]."),
        click.option("--mtp-max", type=click.IntRange(min=1), default=None,
                     help="The most drafts --mtp auto tries per window [default: 3]."),
        click.option("--ple-mode", type=click.Choice(["auto", "mmap", "direct"]), default=None, help="PLE table access."),
        click.option("--expert-io", type=click.Choice(["auto", "mmap", "direct"]), default=None,
                     help="How routed experts are read: mmap (through the page cache), direct (O_DIRECT into RAM "
                          "slots the engine owns, the hot ones kept), auto: direct when they do not fit the memory "
                          "the process may use [default: auto]."),
        click.option("--ram-gib", type=float, default=None,
                     help="RAM slots for directly read experts, GiB [default: the cgroup limit or MemAvailable minus "
                          "dense weights, state and a margin]."),
        click.option("--expert-prefetch", type=click.IntRange(min=0), default=None,
                     help="With direct reads: read ahead the experts the next layer's router ranks best, this many "
                          "ranks per token; 0 = off [default: 2]."),
        click.option("--cache-policy", type=str, default=None,
                     help="Replacement policy of the RAM slots (`strata cache-sim --help` lists them) [default: the "
                          "best measured]."),
        click.option("--ple-cache-mib", type=click.FloatRange(min=0), default=None,
                     help="RAM for PLE table rows kept by row id (gathers read only the rows it misses), MiB; "
                          "0 = off [default: 64]."),
        click.option("--trace", "trace_path", type=click.Path(dir_okay=False, writable=True), default=None,
                     help="Write a Chrome-trace/Perfetto JSON timeline (layers, pool tasks, device copies, waits, "
                          "counters); draw it with `strata plot`."),
        click.option("--repack/--no-repack", default=None, envvar="STRATA_REPACK", show_envvar=True,
                     help="Prefill of IQ2_XXS/IQ2_XS/IQ3_XXS weights (avx512 path) decodes 16 rows at a time into "
                          "an int16 scratch first (bit-identical results; its size is printed at start) "
                          "[default: on]."),
        click.option("--watchdog-s", type=float, default=None,
                     help="Abort a request after this many seconds without progress, keeping its partial output "
                          "[default: 600; 0 = off]."),
    ]
    opts += [click.option(*names, hidden=True, expose_value=False, is_flag=is_flag, callback=_llama_cpp_only(why))
             for names, is_flag, why in _LLAMA_CPP_ONLY]
    for o in reversed(opts):
        f = o(f)
    return f


# llama.cpp flags that Strata has no counterpart for: a user who types them out of habit learns what to use
# instead, rather than meeting click's "No such option" (or, for -ngl, "-n: 'gl' is not a valid integer").
_GPU_EXPERTS = ("`--device cuda --cache-gib X` keeps the experts that fit in X GiB resident on the GPU (the hottest, "
                "swapped as routing changes); missing ones are copied over PCIe (`--pcie-frac`) or run on the CPU")
_LLAMA_CPP_ONLY = (
    (("-ngl", "--n-gpu-layers", "--gpu-layers"), False,
     f"Strata has no layer split: with `--device cuda` every dense layer runs on the GPU; {_GPU_EXPERTS}"),
    (("-ot", "--override-tensor"), False,
     f"Strata places tensors itself, not by name: with `--device cuda` the dense weights go to the GPU; {_GPU_EXPERTS}"),
    (("-ncmoe", "--n-cpu-moe"), False, f"Strata places experts one by one, not by layer: {_GPU_EXPERTS}"),
    (("-cmoe", "--cpu-moe"), True, "every expert already runs on the CPU with `--device cpu` (the default)"),
)


def _llama_cpp_only(why: str):
    """The callback of a hidden llama.cpp flag: given on the command line, it stops with `why`."""
    def refuse(ctx, param, value):
        from click.core import ParameterSource

        if ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE:
            names = "/".join(param.opts)
            raise click.UsageError(f"{names} is llama.cpp's; {why}.", ctx)
    return refuse


_ENGINE = ("threads", "n_ctx", "kv_type", "device", "cache_gib", "dense", "vram_gib", "prefill_f16", "pcie_frac", "prefill_chunk", "mtp", "mtp_max",
           "ple_mode", "ple_cache_mib", "sim_link_gbps", "repack", "expert_io", "ram_gib", "cache_policy", "expert_prefetch",
           "split")



def _with_env(cmd: click.Command) -> click.Command:
    """Every option of cmd also reads STRATA_<LONG_NAME> from the environment (DESIGN §9). click reads
    these (it checks them like the flag and lists them in --help); a flag set neither way reaches
    pyrunner.Model as None, which takes the library's default (pyrunner/settings.py says so)."""
    from .settings import env_name

    for p in cmd.params:
        if isinstance(p, click.Option) and not p.envvar:
            longs = [o for o in p.opts if o.startswith("--")]
            if longs:
                p.envvar = env_name(max(longs, key=len))
                p.show_envvar = True
    return cmd


def _model_kwargs(kwargs: dict) -> tuple[str | None, str | None, dict]:
    """Pops the -m / engine flags: (-m or None, --trace-routing or None, pyrunner.Model's keyword
    arguments from the flags that are set)."""
    path = kwargs.pop("model_path")
    trace = kwargs.pop("trace_routing", None)
    kwargs.pop("trace_path", None)          # (_tracer) and the watchdog (_watchdog) are per request
    kwargs.pop("watchdog_s", None)
    engine = {k: kwargs.pop(k) for k in _ENGINE if kwargs.get(k) is not None}
    for k in _ENGINE:
        kwargs.pop(k, None)
    return path, trace, engine


def _open_model(kwargs: dict):
    """pyrunner.Model from the popped -m / engine flags; with no -m, the default model (models.default_model)."""
    import warnings

    from .model import Model
    from ._native import StrataError
    from .models import MakeModelError, default_model

    path, trace, engine = _model_kwargs(kwargs)
    try:
        if path is None:
            path, notice = default_model(log=lambda s: click.echo(s, err=True))
            click.echo(notice, err=True)
        # Model's warnings (--threads above the cores, n_ctx past the trained context) as plain
        # lines on stderr, without Python's "file:line: UserWarning" and source-line dressing
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            model = Model(path, **engine)
        for w in caught:
            click.echo(f"warning: {w.message}", err=True)
        if model.device_log:
            click.echo(model.device_log, err=True)           # the GPU's memory, part by part
        if model.device != "cpu" or model.offload_stats()["tail_skip"]:
            click.echo(model.offload_log, err=True)          # DESIGN §7: the start-up log
        if model.has_ple:
            from .ple import describe
            click.echo(describe(model), err=True)
        if model.repack_bytes:
            click.echo(f"repack: prefill converts IQ weight rows 16 at a time, {model.repack_bytes / 2**10:.0f} KiB "
                       f"of scratch over {model.n_threads} threads (--no-repack: off)", err=True)
        if trace:
            model.trace_routing(trace)
        return model
    except (MakeModelError, StrataError, ValueError, OSError) as e:
        raise _fail(e) from None


def _tracer(kwargs: dict):
    """A pyrunner.trace.Tracer for --trace FILE (a no-op context without it). Read before _open_model."""
    import contextlib

    from .trace import Tracer

    path = kwargs.get("trace_path")
    if not path:
        return contextlib.nullcontext()
    try:
        return Tracer(path)
    except OSError as e:
        raise click.ClickException(f"--trace {path}: cannot write it ({e.strerror or e})") from None


def _watchdog(kwargs: dict) -> float:
    """--watchdog-s (or STRATA_WATCHDOG_S), default 600; <= 0 turns it off."""
    from .trace import watchdog_seconds

    try:
        return watchdog_seconds(kwargs.get("watchdog_s"))
    except ValueError as e:
        raise click.ClickException(str(e)) from None


def _trace_note(tr) -> None:
    if tr is not None and hasattr(tr, "path"):
        click.echo(f"trace: {tr.meta.get('events', 0)} events in {tr.path} ({tr.meta.get('dropped_events', 0)} "
                   f"dropped); draw it with `strata plot {tr.path} -o timeline.png`", err=True)


def _sampling(kwargs: dict, max_tokens: int):
    from .sampling import params_from_cli

    try:
        return params_from_cli(kwargs, max_tokens=max_tokens)
    except ValueError as e:
        raise _fail(e) from None


def _stats_line(stats: dict, finish_reason: str | None = None) -> str:
    """One human line from generate.py's stats."""
    s = stats
    parts = [f"prompt {s.get('prompt_tokens', 0)} tokens"
             + (f" ({s['reused_prompt_tokens']} reused)" if s.get("reused_prompt_tokens") else "")]
    if "prefill_s" in s:
        parts.append(f"prefill {s['prefill_s']:.3f} s ({s.get('prefill_tps', 0):.1f} tok/s)")
    if "ttft_s" in s:
        parts.append(f"first token {s['ttft_s']:.3f} s")
    parts.append(f"generated {s.get('generated_tokens', 0)} tokens")
    if "decode_s" in s:
        parts.append(f"decode {s['decode_s']:.3f} s ({s.get('decode_tps', 0):.1f} tok/s)")
    if s.get("cache_lookups"):
        parts.append(f"cache hit rate {100 * s.get('hit_rate', 0):.1f} % ({s['cache_hits']}/{s['cache_lookups']})")
    if "drafts_proposed" in s:
        parts.append(f"draft accepted {s['drafts_accepted']}/{s['drafts_proposed']}"
                     + (f" (mean accepted length {s['mean_accepted_len']:.2f} in {s['mtp_windows']} windows,"
                        f" rollback {s['mtp_rollback_s'] * 1e3:.1f} ms)" if s.get("mtp_windows") else ""))
    if finish_reason:
        parts.append(f"finish: {finish_reason}")
    return ", ".join(parts)


@_with_env
@main.command()
@click.argument("prompt", required=False)
@click.option("-p", "--prompt", "prompt_opt", default=None, metavar="TEXT",
              help='The prompt, as llama.cpp takes it: instead of PROMPT ("-": standard input).')
@click.option("-n", "--n-predict", "max_tokens", type=int, default=256, show_default=True,
              help="Tokens to generate at most; -1: until the model ends or the context is full; -2 (llama.cpp: "
                   "until the context is filled): the same, as Strata never shifts the context.")
@sampling_options
@click.option("--json", "as_json", is_flag=True,
              help='Print {"text", "tokens", "finish_reason", "stats"} as one JSON object.')
@_engine_options
def generate(prompt, prompt_opt, max_tokens, as_json, **kwargs):
    """Continue PROMPT (or -p TEXT, or standard input when both are absent or "-"), streaming the text;
    timings on standard error."""
    from click.core import ParameterSource

    from ._native import StrataError
    from .generate import generate as run

    if prompt_opt is not None:
        if prompt is None:
            prompt = prompt_opt
        elif click.get_current_context().get_parameter_source("prompt_opt") is ParameterSource.COMMANDLINE:
            raise click.ClickException("the prompt is given twice, as PROMPT and as -p/--prompt: give one")
        # else PROMPT on the command line wins over STRATA_PROMPT in the environment
    if prompt is None or prompt == "-":
        if sys.stdin.isatty() and prompt is None:
            raise click.ClickException('give a prompt: strata generate "Once upon a time" (or pipe text in)')
        prompt = sys.stdin.read()
    params = _sampling(kwargs, max_tokens)
    wd = _watchdog(kwargs)
    tracer = _tracer(kwargs)
    model = _open_model(kwargs)
    try:
        with tracer, model:
            if as_json:
                c = run(model, prompt, watchdog_s=wd, **_asdict(params))
                click.echo(json.dumps(c.to_dict(), ensure_ascii=False))
            else:
                stream = run(model, prompt, stream=True, watchdog_s=wd, **_asdict(params))
                for piece in stream:
                    click.echo(piece, nl=False)
                    sys.stdout.flush()
                click.echo("")
                c = stream.completion
                click.echo(_stats_line(c.stats, c.finish_reason), err=True)
    except (StrataError, ValueError) as e:
        raise _fail(e) from None
    _trace_note(tracer)
    if c.error is not None:     # the partial text is out; the error goes to stderr and the exit status
        raise click.ClickException(c.error)


def _asdict(params) -> dict:
    from dataclasses import asdict

    return asdict(params)


_CHAT_HELP = ("/reset forgets the conversation, /stats shows the last answer's timings, /exit quits (so "
              "does Ctrl-D); end a line with \\ to continue the message on the next line; Ctrl-C stops "
              "an answer (what it said so far stays in the conversation).")


def _ctrl_c_stops(stream):
    """A context in which the first Ctrl-C asks `stream` to stop after the token it is on, instead of
    raising KeyboardInterrupt wherever Python happens to be: the native evaluation in flight completes, so
    the session keeps a known state that the next turn continues (prefix reuse) and the partial answer
    comes back with its stats. A second Ctrl-C during the same answer interrupts at once (the session's
    state is then lost and the next turn starts over). Only the main thread may set signal handlers."""
    import contextlib
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def handler():
        asked = []

        def on_sigint(signum, frame):
            if asked:
                raise KeyboardInterrupt
            asked.append(signum)
            stream.stop()
        old = signal.signal(signal.SIGINT, on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, old)
    return handler()


def _read_message(interactive: bool) -> str | None:
    """One user message (lines ending in a backslash continue it); None at end of input."""
    lines = []
    while True:
        if interactive:
            try:
                line = input("> " if not lines else ". ")
            except EOFError:
                click.echo("")            # Ctrl-D: leave the terminal on a fresh line
                line = None
        else:
            line = sys.stdin.readline()
            line = line.rstrip("\n").rstrip("\r") if line else None
        if line is None:
            return "\n".join(lines) if lines else None
        if line.endswith("\\"):
            lines.append(line[:-1])
            continue
        lines.append(line)
        return "\n".join(lines)


@_with_env
@main.command()
@click.option("-n", "--n-predict", "max_tokens", type=int, default=512, show_default=True,
              help="Tokens per answer at most (-1: until the model ends its turn or the context is full).")
@click.option("--system", default=None, help="A system message that opens the conversation.")
@click.option("--chat-template-kwargs", "template_kwargs", default=None,
              help='Extra chat template variables as a JSON object, e.g. \'{"enable_thinking": false}\'.')
@sampling_options
@_engine_options
def chat(max_tokens, system, template_kwargs, **kwargs):
    """Talk with the model in its chat template, answers streamed. Reads standard input, so a
    conversation can be piped in. /reset forgets the conversation, /stats shows the last answer's
    timings, /exit quits (so does Ctrl-D); end a line with a backslash to continue the message on the
    next line; Ctrl-C stops an answer, not the program: the partial answer stays in the conversation (as
    llama.cpp's and ollama's REPLs keep it), /stats shows its figures, and the next turn continues from
    it without evaluating the conversation again."""
    import importlib

    from ._native import StrataError
    from .chat import ChatTemplateError
    from .generate import ChatTurn, chat_prompt_ids, forget, generate as run

    params = _asdict(_sampling(kwargs, max_tokens))
    try:
        variables = json.loads(template_kwargs) if template_kwargs else {}
    except ValueError as e:
        raise click.ClickException(f"--chat-template-kwargs: not valid JSON ({e}); write e.g. "
                                   '\'{"enable_thinking": false}\'') from None
    if not isinstance(variables, dict):
        raise click.ClickException("--chat-template-kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    from .batch import LiveStats

    wd = _watchdog(kwargs)
    tracer = _tracer(kwargs)
    model = _open_model(kwargs)
    interactive = sys.stdin.isatty()
    base = [{"role": "system", "content": system}] if system else []
    messages = list(base)
    last = None
    turn = None      # the last finished turn, which the next one continues token for token
    live = LiveStats()   # the conversation's running totals for /stats
    with tracer, model:
        sess = model.session()
        if interactive:
            try:
                importlib.import_module("readline")      # line editing and history for input()
            except ImportError:
                pass
            click.echo(f"strata chat: {model.path}. {_CHAT_HELP}", err=True)
        while True:
            try:
                text = _read_message(interactive)
            except KeyboardInterrupt:
                click.echo("\n(Ctrl-C stops an answer; /exit or Ctrl-D quits)", err=True)
                continue
            if text is None:
                break
            cmd = text.strip()
            if not cmd:
                continue
            if cmd.startswith("/") and "\n" not in cmd:
                if cmd in ("/exit", "/quit"):
                    break
                if cmd == "/reset":
                    messages = list(base)
                    forget(sess)
                    last = turn = None
                    click.echo("(conversation cleared)")
                elif cmd == "/stats":
                    click.echo(f"({_stats_line(last[0], last[1])}; conversation: {live.line()}; "
                               f"context {sess.n_past}/{model.n_ctx} tokens)" if last else "(no answer yet)")
                else:
                    click.echo(f"(unknown command {cmd}; {_CHAT_HELP})")
                continue
            messages.append({"role": "user", "content": text})
            try:
                ids, prompt_text = chat_prompt_ids(model, messages, turn, **variables)
                stream = run(model, ids, session=sess, stream=True, watchdog_s=wd, **params)
                parts = []
                try:
                    with _ctrl_c_stops(stream):
                        for piece in stream:
                            parts.append(piece)
                            click.echo(piece, nl=False)
                            sys.stdout.flush()
                    c = stream.completion
                    last = (c.stats, c.finish_reason)
                    live.add(c.stats)
                    turn = ChatTurn(ids, prompt_text, c.tokens, c.text)
                    if c.finish_reason == "interrupted":
                        click.echo(" (stopped)", nl=False)
                    if c.error is not None:     # the watchdog: the partial answer stays, the chat goes on
                        click.echo("", err=True)
                        click.echo(f"error: {c.error}", err=True)
                        turn = None
                except KeyboardInterrupt:       # a second Ctrl-C: the state of the session is unknown
                    click.echo(" (stopped)", nl=False)
                    last = turn = None
                click.echo("")
                messages.append({"role": "assistant", "content": "".join(parts)})
            except (ChatTemplateError, StrataError, ValueError) as e:
                messages.pop()
                click.echo(f"error: {e}" + ("; /reset starts a new conversation" if "context" in str(e) else ""),
                           err=True)
    _trace_note(tracer)


@_with_env
@main.command()
@click.argument("in_path", metavar="IN.jsonl", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", "out_path", required=True, type=click.Path(dir_okay=False),
              help="Results, one JSON line per request (not the input file); requests already there are skipped.")
@click.option("--retry-errors", is_flag=True,
              help="Run again the requests whose record in OUT is an error; the new record replaces it.")
@click.option("-n", "--n-predict", "max_tokens", type=int, default=256, show_default=True,
              help="Default max_tokens of a request (-1: until the model ends or the context is full).")
@sampling_options
@click.option("--parallel", type=click.IntRange(min=1), default=None, envvar="STRATA_PARALLEL",
              help="Sequences run at once, batched into each forward step (default: as many as the memory "
                   "their state needs leaves room for, at most 16; 1: one after another). Greedy output is the "
                   "same whatever the count.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Run the file on a Ray cluster (Ray Data; each actor loads the model once): --ray alone or "
                   "--ray local starts a cluster on this machine bound to 127.0.0.1 only, --ray HEAD:6379 joins "
                   "that cluster (every node needs strata and the model at the same path).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@_engine_options
def batch(in_path, out_path, retry_errors, max_tokens, parallel, ray_address, quiet, **kwargs):
    """Run the requests in IN.jsonl (UTF-8; {"id", "prompt"} or {"id", "messages"} per line, plus
    optional OpenAI-named sampling fields) and write one JSON line per request to OUT.jsonl, in input
    order; a line that cannot run gets an "error" naming its line and the run goes on. Re-running the
    same command resumes (also after kill -9): ids already in OUT.jsonl are skipped, or with
    --retry-errors only those whose record is a result. OUT.jsonl keeps one record per id, the newest,
    and is rewritten through a temporary file and a rename, never in place. The flags are the defaults
    of every request."""
    from ._native import StrataError
    from .batch import BatchError, check_paths, run_batch

    try:
        check_paths(in_path, out_path)      # before the model loads: a wrong -o fails at once
    except BatchError as e:
        raise _fail(e) from None
    params = _sampling(kwargs, max_tokens)
    wd = _watchdog(kwargs)
    if ray_address is not None:             # the actors load the model, not this process
        if kwargs.get("trace_path") or kwargs.get("trace_routing"):
            raise click.ClickException("--trace and --trace-routing record one process; run without --ray to trace")
        from .models import MakeModelError, default_model
        from .ray_batch import run_batch_ray

        path, _, engine = _model_kwargs(kwargs)
        try:
            if path is None and ray_address == "local":     # a cluster's nodes each load their own default
                path, notice = default_model(log=lambda s: click.echo(s, err=True))
                click.echo(notice, err=True)
            counts = run_batch_ray(path, engine, in_path, out_path, params, address=ray_address, parallel=parallel,
                                   retry_errors=retry_errors, progress=not quiet, watchdog_s=wd)
        except (BatchError, MakeModelError, OSError) as e:
            raise _fail(e) from None
    else:
        tracer = _tracer(kwargs)
        model = _open_model(kwargs)
        from .engine import EngineStopped

        try:
            with tracer, model:
                counts = run_batch(model, in_path, out_path, params, progress=not quiet, watchdog_s=wd,
                                   retry_errors=retry_errors, parallel=parallel)
        except (BatchError, StrataError, EngineStopped) as e:   # the results so far are in OUT: a rerun resumes
            raise _fail(e) from None
        _trace_note(tracer)
    click.echo(f"batch: {counts['total']} requests in {in_path}: {counts['done']} run, {counts['errors']} with errors, "
               f"{counts['skipped']} already in {out_path}"
               + (f", {counts['duplicates']} duplicate ids ignored" if counts["duplicates"] else ""), err=True)


# ------------------------------------------------------------------ cache-sim


def _cache_policy_names() -> list[str]:
    from .cachesim import POLICIES
    return list(POLICIES)


@main.command("cache-sim")
@click.argument("trace", type=click.Path(exists=True, dir_okay=False))
@click.option("--capacity", default=None,
              help="Expert slots over all layers: a count (e.g. 96) or a share of all experts (e.g. 25%).")
@click.option("--policy", type=click.Choice(_cache_policy_names()), default="hotness", show_default=True,
              help="Replacement policy: the seed's hotness replay, the engine's --cache-policy names "
                   "(native/src/moe/policy.h, the same code), or belady, the clairvoyant optimum.")
@click.option("--interval", type=int, default=None,
              help="hotness: windows between adjustment rounds [default: 32, as the engine].")
@click.option("--experts", "n_expert", type=int, default=None,
              help="Experts per layer, for a percentage capacity (default: the largest id in the trace + 1).")
@click.option("--compare", is_flag=True,
              help="Every policy at every --capacities fraction: hit rate and its ratio to Belady's.")
@click.option("--capacities", default="0.25,0.5,0.75", show_default=True,
              help="--compare: capacity fractions, shares of all n_layer x n_expert slots.")
@click.option("--check-online", is_flag=True,
              help="Replay prefixes of the trace and fail if an online policy's hits in the first t windows "
                   "change when later windows are removed (always on with --compare).")
@click.option("--json", "as_json", is_flag=True, help="Print {policy, capacity, hits, lookups, hit_rate} as JSON "
                                                       "(--compare: the whole table).")
def cache_sim(trace, capacity, policy, interval, n_expert, compare, capacities, check_online, as_json):
    """Replay a routing trace (written by --trace-routing) through an expert-cache policy and report
    its hit rate: hits / lookups over every routed pick."""
    from . import cachesim

    if not compare and capacity is None:
        raise click.ClickException("cache-sim: give --capacity (slots, or a share such as 25%), or --compare")
    interval = cachesim.HOT_INTERVAL if interval is None else interval
    try:
        records = cachesim.read_trace(trace)
        n_layer, seen_experts = cachesim.trace_shape(records)
        if n_expert is not None and n_expert < seen_experts:
            raise ValueError(f"--experts {n_expert}: the trace routes to expert id {seen_experts - 1}")
        n_expert = n_expert or seen_experts
        if compare:
            try:
                fracs = [float(x) for x in capacities.split(",") if x.strip()]
            except ValueError:
                raise ValueError(f"--capacities {capacities!r}: give fractions such as 0.25,0.5,0.75") from None
            table = cachesim.compare(records, fracs, n_layer=n_layer, n_expert=n_expert, online_check=True,
                                     interval=interval)
        else:
            slots = cachesim.parse_capacity(capacity, n_layer, n_expert)
            res = cachesim.simulate(records, slots, policy, n_layer=n_layer, n_expert=n_expert, interval=interval)
            if check_online and policy != "belady":
                cachesim.check_online(records, slots, policy, n_layer, n_expert)
    except cachesim.TraceError as e:
        raise _fail(e) from None
    except AssertionError as e:
        raise click.ClickException(f"cache-sim: online check failed: {e}") from None
    except ValueError as e:
        raise click.ClickException(f"cache-sim: {e}") from None
    if compare:
        if as_json:
            click.echo(json.dumps(table))
            return
        click.echo(f"{trace}: {table['windows']} windows, {table['lookups']} picks, {n_layer} layers x "
                   f"{n_expert} experts; online check passed for every policy but belady; default "
                   f"--cache-policy {table['default']}")
        click.echo(f"{'policy':<12} {'capacity':>10} {'slots':>7} {'hit rate':>9} {'/ belady':>9}")
        for r in table["rows"]:
            click.echo(f"{r['policy']:<12} {100 * r['fraction']:>9.1f}% {r['capacity']:>7d} "
                       f"{r['hit_rate']:>9.4f} {r['vs_belady']:>9.3f}")
        return
    if as_json:
        click.echo(json.dumps(res.to_json()))
        return
    n_windows = sum(1 for _ in cachesim.windows(records))
    click.echo(f"{policy}: {res.hits}/{res.lookups} hits ({100 * res.hit_rate:.1f} %) with {slots} slots "
               f"({100 * slots / (n_layer * n_expert):.1f} % of {n_layer} layers x {n_expert} experts), "
               f"{n_windows} windows" + (", online check passed" if check_online and policy != "belady" else ""))

# ------------------------------------------------------------------ plot


@main.command()
@click.argument("trace", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False), help="The PNG to write.")
@click.option("--bins", type=int, default=200, show_default=True, help="Time bins of the busy and routing panels.")
def plot(trace, out, bins):
    """Draw a --trace timeline as a PNG: routing and cache panels on top, RAM / device memory, CPU and
    device busy and storage reads below, request boundaries marked, and a per-request summary table
    (also printed)."""
    from .plot import PlotError, render

    try:
        res = render(trace, out, bins=max(10, bins))
    except PlotError as e:
        raise _fail(e) from None
    click.echo(res["summary"])
    click.echo(f"wrote {out} ({res['requests']} requests)", err=True)


# ------------------------------------------------------------------ serve


@_with_env
@main.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; 0.0.0.0 opens it to the network (then set --api-key).")
@click.option("--port", type=int, default=8080, show_default=True, help="TCP port (0: a free one, printed at start).")
@click.option("--api-key", default=None, envvar="STRATA_API_KEY", show_envvar=True,
              help="Require 'Authorization: Bearer KEY' on every route but /health.")
@click.option("--max-concurrent", type=int, default=None,
              help="Sequences generated at once [default: as many as fit, at most 16].")
@click.option("--max-queue", type=int, default=None,
              help="Requests waiting beyond those; more get 503 with Retry-After [default: no limit].")
@click.option("--grace-s", type=float, default=10.0, show_default=True,
              help="At SIGTERM / Ctrl-C, how long the requests in flight may run on before they are cancelled.")
@click.option("--itl-factor", type=float, default=2.0, show_default=True,
              help="While requests decode, a prompt is prefilled in pieces sized from live costs so that a step "
                   "takes about this many times a decode-only step (0: whole 512-token steps, the fastest prefill).")
@_engine_options
def serve(host, port, api_key, max_concurrent, max_queue, grace_s, itl_factor, **kwargs):
    """Serve the model over OpenAI's HTTP API: POST /v1/completions and /v1/chat/completions (streaming
    too), GET /v1/models, /health and /metrics (Prometheus). Requests are batched: up to --max-concurrent
    generate together, --max-queue more wait. SIGTERM or Ctrl-C stops accepting, lets the requests in
    flight finish for --grace-s seconds, cancels the rest, and says which were which."""
    from ._native import StrataError

    for name, v, lo in (("--max-concurrent", max_concurrent, 1), ("--max-queue", max_queue, 0)):
        if v is not None and v < lo:
            raise click.ClickException(f"{name} {v}: give at least {lo}")
    if not grace_s >= 0:                      # NaN too
        raise click.ClickException(f"--grace-s {grace_s}: give 0 or more seconds")
    if itl_factor != 0 and not 1 < itl_factor < math.inf:
        raise click.ClickException(f"--itl-factor {itl_factor}: give a factor above 1, or 0 (whole-step prefill)")
    if not 0 <= port <= 65535:
        raise click.ClickException(f"--port {port}: give a TCP port, 0..65535 (0: any free one)")
    try:
        from .server import serve as run
    except ImportError as e:
        raise click.ClickException(f"strata serve needs starlette and uvicorn ({e}); pip install starlette uvicorn") \
            from None

    def echo(line: str) -> None:
        click.echo(line)
        sys.stdout.flush()

    wd = _watchdog(kwargs)
    tracer = _tracer(kwargs)
    model = _open_model(kwargs)
    try:
        with tracer, model:
            run(model, host=host, port=port, api_key=api_key, max_concurrent=max_concurrent, max_queue=max_queue,
                watchdog_s=wd, grace_s=grace_s, itl_factor=itl_factor or None, echo=echo)
    except (StrataError, OSError, ValueError) as e:
        raise _fail(e) from None
    _trace_note(tracer)


if __name__ == "__main__":
    main()
