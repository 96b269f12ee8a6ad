#!/usr/bin/env python3
"""make_model.py — write a random qwen4exp GGUF from a preset in models/ (deterministic: the same preset,
recipe and seed give the same bytes).

    python tools/make_model.py PRESET -o OUT.gguf [--recipe f32|q8_0|iq2_xs|nvfp4|q4_k_m] [--seed S]
    python tools/make_model.py PRESET --dry-run [--recipe R]      # tensor list, types and size only

PRESET is a name in models/ (tiny, small, bench, ple-full) or a path to such a JSON file. The builder lives
in the package (pyrunner/models.py, which documents presets, fill modes and recipes) so that the installed
`strata` can build its default demo model; this file is its command line.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from pyrunner import convert  # noqa: E402
from pyrunner.models import (RECIPES, MakeModelError, build_tokenizer, load_preset, make_model,  # noqa: E402,F401
                             plan_model, preset_names, presets_dir)

MODELS_DIR = presets_dir()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("preset", help="a preset in models/ or a path to a preset .json")
    ap.add_argument("-o", "--output", help="output GGUF path")
    ap.add_argument("--recipe", default=None, choices=RECIPES,
                    help="type mix (default: f32 for float presets, iq2_xs for direct-block presets)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dry-run", action="store_true", help="print the planned tensors and size; write nothing")
    ap.add_argument("-q", "--quiet", action="store_true")
    ap.add_argument("--mtp", action="store_true", help="add the MTP head (llama-cpp-python 0.3.36 cannot load such files)")
    a = ap.parse_args(argv)
    try:
        p = load_preset(a.preset)
        if a.mtp:
            p = {**p, "mtp_num_hidden_layers": 1}
        recipe = a.recipe or ("iq2_xs" if p.get("direct_blocks") else "f32")
        if a.dry_run:
            info = plan_model(p, recipe, a.seed)
            info.pop("_plan")
            for t in info["tensors"]:
                print(f"{t['name']:40s} {t['type']:7s} {str(t['shape']):28s} {t['size']:>14,d}")
            print(f"{len(info['tensors'])} tensors, {info['bytes'] / 1e9:.3f} GB ({info['bytes'] / 2**30:.3f} GiB)")
            for k, v in sorted(info["types"].items(), key=lambda kv: -kv[1]):
                print(f"  {k:7s} {v / info['bytes']:6.1%}  {v / 1e9:.3f} GB")
            return 0
        if not a.output:
            ap.error("-o OUT.gguf is required (or --dry-run)")
        info = make_model(a.preset, a.output, recipe, a.seed, log=None if a.quiet else
                          (lambda s: print(s, file=sys.stderr, flush=True)), mtp=a.mtp)
        print(f"{a.output}: {info['file_bytes'] / 1e9:.3f} GB, {len(info['tensors'])} tensors, recipe {recipe}, "
              f"seed {a.seed}, {info['seconds']:.1f} s")
        return 0
    except (MakeModelError, convert.ConvertError) as e:
        print(f"make_model: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
