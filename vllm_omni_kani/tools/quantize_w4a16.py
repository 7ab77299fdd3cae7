"""Write a W4A16 (int4 weight-only) copy of a Kani checkpoint that vLLM loads with its compressed-tensors support.

``python -m vllm_omni_kani.tools.quantize_w4a16 SRC OUT [--group-size 128] [--backend llmcompressor|rtn]``

What gets quantized: the linear layers that vLLM 0.26's LFM2 builds with a quantization method, i.e. attention
``q_proj``/``k_proj``/``v_proj``/``out_proj`` and the MLP's ``w1``/``w2``/``w3`` of every layer. Everything else
stays as it is, bit for bit: the embeddings (``lm_head`` is tied to them), the norms, the short-conv blocks (vLLM
builds ``conv``, ``in_proj`` and ``out_proj`` of a short-conv layer without a quantization method, so they must stay
dense), the codebook heads ``cb2_head``…``cb4_head`` and Kani-TTS-2's speaker projection and RoPE scales. The codec
folder, tokenizer, generation config and every other file are copied; ``config.json`` is the source's with a
``quantization_config`` block added.

Format: compressed-tensors ``pack-quantized``: per quantized layer ``weight_packed`` (int32, eight 4-bit values per
word along the input dimension, value ``j`` of a word in bits ``4j..4j+3``, stored as ``q + 8``), ``weight_scale``
(``[out, in / group_size]`` in the weights' dtype) and ``weight_shape`` (``[out, in]``, int64). Symmetric, group-wise,
round to nearest, data-free: ``scale = max|w| / 7.5`` per group of ``group_size`` input columns and
``q = clamp(round(w / scale), -8, 7)``, so a dequantised weight ``q · scale`` is within half a step of the original
(0.53 of a step at most for bf16 weights, whose stored scale can round below ``max|w| / 7.5``). vLLM reads this as
``uint4b8``: Marlin kernels on NVIDIA GPUs, ``CPUWNA16`` on CPU, which takes bf16/fp16 activations only.

Backends, which write the same scales and, for float32 weights, the same codes (for bf16 weights llm-compressor
divides by the scale in bf16, so a code at a rounding tie can land one step away: 0.65 % of the 350m factory
checkpoint's, at the same RMS error):

* ``llmcompressor`` (default): llm-compressor's ``oneshot`` with a data-free ``QuantizationModifier`` (the ``W4A16``
  scheme with the chosen group size). It needs compressed-tensors 0.19, vLLM 0.26 pins 0.17: when llm-compressor
  is not importable here, the quantization runs in the venv of ``scripts/llmcompressor_env.sh`` (made on first use)
  or in ``--llmcompressor-python``, as a subprocess of this module.
* ``rtn``: this module's own writer (torch and safetensors only), for machines without that venv.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

NUM_BITS = 4
PACK_FACTOR = 32 // NUM_BITS
Q_MIN, Q_MAX = -(1 << (NUM_BITS - 1)), (1 << (NUM_BITS - 1)) - 1  # -8, 7
DEFAULT_GROUP_SIZE = 128
BACKENDS = ("llmcompressor", "rtn")
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
QUANT_SUFFIXES = ("weight_packed", "weight_scale", "weight_shape")
# Hugging Face module names of the LFM2 linears that vLLM builds with a quantization method.
QUANTIZED_MODULE = re.compile(
    r"^model\.layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|out_proj)|feed_forward\.w[123])$"
)
# What llm-compressor must leave dense (it targets every nn.Linear): the tied lm_head, the short-conv blocks and the
# codebook heads (which a plain LFM2 model does not have, named for completeness).
LLMCOMPRESSOR_IGNORE = ("lm_head", r"re:.*\.conv\..*", r"re:^cb\d+_head$")
REPO_ROOT = Path(__file__).resolve().parents[2]
LLMC_ENV_SCRIPT = REPO_ROOT / "scripts" / "llmcompressor_env.sh"
LLMC_PYTHON_ENV = "KANI_LLMC_PYTHON"


class QuantizeError(Exception):
    """Bad input or a failed backend: reported without a traceback."""


# --- the format ---------------------------------------------------------------------------------------------------


def quantization_config(group_size: int, ignore: Iterable[str], version: str) -> dict:
    """The ``quantization_config`` block of ``config.json`` for symmetric int4 group-wise ``pack-quantized`` weights,
    with the fields compressed-tensors' ``QuantizationConfig`` writes."""
    weights = {
        "num_bits": NUM_BITS,
        "type": "int",
        "symmetric": True,
        "group_size": group_size,
        "strategy": "group",
        "block_structure": None,
        "dynamic": False,
        "actorder": None,
        "observer": "minmax",
        "observer_kwargs": {},
    }
    return {
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": None,
                "output_activations": None,
                "format": "pack-quantized",
            }
        },
        "format": "pack-quantized",
        "global_compression_ratio": None,
        "ignore": list(ignore),
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": version,
    }


def quantize_weight(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[out, in]`` float weight → ``(q int8 [out, in] in [-8, 7], scale [out, in / group_size] in weight.dtype)``.

    The scale is stored in the weight's dtype and ``q`` is rounded against that stored scale, so dequantisation with
    the file's scale is within half a step (plus the clamp of a +7.5 step to +7)."""
    out_features, in_features = weight.shape
    if in_features % group_size:
        raise QuantizeError(f"group size {group_size} does not divide {in_features} input features")
    groups = weight.float().reshape(out_features, in_features // group_size, group_size)
    absmax = groups.abs().amax(dim=-1)
    scale = (absmax / ((Q_MAX - Q_MIN) / 2)).to(weight.dtype)
    scale = torch.where(scale == 0, torch.tensor(torch.finfo(weight.dtype).eps, dtype=weight.dtype), scale)
    q = torch.clamp(torch.round(groups / scale.float().unsqueeze(-1)), Q_MIN, Q_MAX)
    return q.reshape(out_features, in_features).to(torch.int8), scale.contiguous()


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int8 ``[out, in]`` in [-8, 7] → int32 ``[out, ceil(in / 8)]``: ``q + 8`` in 4 bits, value ``j`` of a word in
    bits ``4j..4j+3`` (the last word zero-padded)."""
    out_features, in_features = q.shape
    words = -(-in_features // PACK_FACTOR)
    unsigned = torch.zeros(out_features, words * PACK_FACTOR, dtype=torch.int64)
    unsigned[:, :in_features] = q.to(torch.int64) - Q_MIN
    nibbles = unsigned.view(out_features, words, PACK_FACTOR)
    shifts = torch.arange(PACK_FACTOR, dtype=torch.int64) * NUM_BITS
    packed = (nibbles << shifts).sum(dim=-1)  # < 2**32: fits, then wraps into int32's range
    return torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)


def unpack_int4(packed: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: int32 ``[out, words]`` → int8 ``[out, in]`` in [-8, 7]."""
    out_features, in_features = shape
    shifts = torch.arange(PACK_FACTOR, dtype=torch.int64) * NUM_BITS
    nibbles = (packed.to(torch.int64).unsqueeze(-1) >> shifts) & ((1 << NUM_BITS) - 1)
    return (nibbles.reshape(out_features, -1)[:, :in_features] + Q_MIN).to(torch.int8)


def dequantize(tensors: dict[str, torch.Tensor], module: str) -> torch.Tensor:
    """The float32 weight ``q · scale`` of one quantized module of a written checkpoint."""
    shape = tuple(int(x) for x in tensors[f"{module}.weight_shape"].tolist())
    q = unpack_int4(tensors[f"{module}.weight_packed"], shape).float()
    scale = tensors[f"{module}.weight_scale"].float()
    return (q.view(shape[0], scale.shape[1], -1) * scale.unsqueeze(-1)).reshape(shape)


def quantized_modules(names: Iterable[str]) -> set[str]:
    """Modules of a source checkpoint that get quantized (from its tensor names)."""
    return {n.removesuffix(".weight") for n in names if n.endswith(".weight") and QUANTIZED_MODULE.match(n[:-7])}


def dense_linears(tensors: dict[str, torch.Tensor], quantized: set[str]) -> list[str]:
    """Linear layers left dense, for the ``ignore`` list: ``lm_head`` and every other 2-D ``.weight`` of a module that
    is not an embedding (short-conv projections, codebook heads, speaker projection)."""
    names = {
        n.removesuffix(".weight")
        for n, t in tensors.items()
        if n.endswith(".weight") and t.ndim == 2 and not n.endswith("embed_tokens.weight")
    }
    return ["lm_head", *sorted(names - quantized - {"lm_head"})]


# --- checkpoint I/O -----------------------------------------------------------------------------------------------


def _weight_files(src: Path) -> list[Path]:
    index = src / INDEX_FILE
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [src / shard for shard in shards]
    if (src / WEIGHTS_FILE).exists():
        return [src / WEIGHTS_FILE]
    raise QuantizeError(f"{src} has no {WEIGHTS_FILE} (nor {INDEX_FILE})")


def load_source(src: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(config.json, every tensor)`` of a dense checkpoint."""
    config_path = src / "config.json"
    if not config_path.exists():
        raise QuantizeError(f"{src} has no config.json")
    config = json.loads(config_path.read_text())
    if "quantization_config" in config:
        method = config["quantization_config"].get("quant_method")
        raise QuantizeError(f"{src} is already quantized ({method}); start from the dense checkpoint")
    tensors: dict[str, torch.Tensor] = {}
    for file in _weight_files(src):
        tensors.update(load_file(file))
    return config, tensors


def _copy_other_files(src: Path, out: Path) -> None:
    """Everything but the weights and config.json: tokenizer, generation config, codec/, speaker_model/, ..."""
    skip = {"config.json", INDEX_FILE, *(f.name for f in _weight_files(src))}
    for item in src.iterdir():
        if item.name in skip:
            continue
        if item.is_dir():
            shutil.copytree(item, out / item.name, dirs_exist_ok=True)
        else:
            shutil.copy2(item, out / item.name)


def _prepare_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise QuantizeError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise QuantizeError(f"{out} is not empty; pass --force to overwrite it")
    out.mkdir(parents=True, exist_ok=True)


def _check_group_size(tensors: dict[str, torch.Tensor], modules: set[str], group_size: int) -> None:
    if group_size <= 0 or group_size % 2:
        raise QuantizeError(f"group size must be a positive even number, got {group_size}")
    if not modules:
        raise QuantizeError("the checkpoint has none of LFM2's attention or MLP linears to quantize")
    for module in sorted(modules):
        in_features = tensors[f"{module}.weight"].shape[1]
        if in_features % group_size:
            raise QuantizeError(
                f"group size {group_size} does not divide {module}'s {in_features} input features; "
                f"choose one that divides the hidden size and the MLP width (e.g. 32 for the tiny preset)"
            )


# --- backends -----------------------------------------------------------------------------------------------------


def _rtn_tensors(tensors: dict[str, torch.Tensor], modules: set[str], group_size: int) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for module in sorted(modules):
        weight = tensors[f"{module}.weight"]
        q, scale = quantize_weight(weight, group_size)
        out[f"{module}.weight_packed"] = pack_int4(q)
        out[f"{module}.weight_scale"] = scale
        out[f"{module}.weight_shape"] = torch.tensor(list(weight.shape), dtype=torch.int64)
    return out


def _run_llmcompressor(src: Path, work: Path, group_size: int) -> None:
    """Quantize ``src`` with llm-compressor into ``work`` (a ``save_pretrained(save_compressed=True)`` directory),
    in this interpreter if it has llm-compressor, else in its own venv as a subprocess."""
    try:
        import llmcompressor  # noqa: F401
    except ImportError:
        pass
    else:
        llmcompressor_worker(src, work, group_size)
        return
    python = _llmcompressor_python()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    argv = [python, "-m", "vllm_omni_kani.tools.quantize_w4a16"]
    argv += ["--llmcompressor-worker", str(src), str(work), "--group-size", str(group_size)]
    run = subprocess.run(argv, env=env, cwd=REPO_ROOT, capture_output=True, text=True)
    if run.returncode != 0:
        raise QuantizeError(f"llm-compressor failed ({python}):\n{(run.stdout + run.stderr)[-4000:]}")


def _llmcompressor_python() -> str:
    explicit = os.environ.get(LLMC_PYTHON_ENV)
    if explicit:
        return explicit
    if not LLMC_ENV_SCRIPT.exists():
        raise QuantizeError(
            f"llm-compressor is not importable here and {LLMC_ENV_SCRIPT} is missing: pass --llmcompressor-python "
            f"(or set {LLMC_PYTHON_ENV}) or use --backend rtn"
        )
    run = subprocess.run(["bash", str(LLMC_ENV_SCRIPT)], capture_output=True, text=True, cwd=REPO_ROOT)
    if run.returncode != 0:
        raise QuantizeError(
            f"could not make the llm-compressor environment ({LLMC_ENV_SCRIPT}); use --backend rtn:\n"
            f"{run.stderr[-3000:]}"
        )
    return run.stdout.strip().splitlines()[-1]


def llmcompressor_worker(src: Path, work: Path, group_size: int) -> None:
    """Runs where llm-compressor is installed: data-free W4A16 of the LFM2 backbone of ``src`` into ``work``.

    The backbone loads as a plain transformers ``Lfm2ForCausalLM`` (the codebook heads and Kani-TTS-2's extra
    tensors are not part of it and are carried over from the source afterwards)."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import Lfm2ForCausalLM

    model = Lfm2ForCausalLM.from_pretrained(str(src), dtype="auto")
    # The W4A16 preset scheme with the group size made a parameter (the preset's is 128).
    weights = QuantizationArgs(num_bits=NUM_BITS, type="int", symmetric=True, strategy="group", group_size=group_size)
    scheme = QuantizationScheme(targets=["Linear"], weights=weights)
    recipe = QuantizationModifier(config_groups={"group_0": scheme}, ignore=list(LLMCOMPRESSOR_IGNORE))
    oneshot(model=model, recipe=recipe)  # no dataset: min-max scales from the weights alone
    model.save_pretrained(str(work), save_compressed=True)


def _llmcompressor_tensors(
    src: Path, modules: set[str], group_size: int, tmp: Path
) -> tuple[dict[str, torch.Tensor], dict, Path | None]:
    """``(quantized tensors, llm-compressor's quantization_config, its recipe.yaml or None)``."""
    work = tmp / "llmcompressor"
    _run_llmcompressor(src, work, group_size)
    written = json.loads((work / "config.json").read_text()).get("quantization_config")
    if written is None:
        raise QuantizeError(f"llm-compressor wrote no quantization_config into {work / 'config.json'}")
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(work.glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if name.rsplit(".", 1)[-1] in QUANT_SUFFIXES:
                    tensors[name] = f.get_tensor(name)
    got = {name.rsplit(".", 1)[0] for name in tensors}
    if got != modules:
        raise QuantizeError(
            f"llm-compressor quantized {sorted(got - modules)[:4]}... that vLLM's LFM2 keeps dense, or left "
            f"{sorted(modules - got)[:4]}... dense"
        )
    recipe = work / "recipe.yaml"
    return tensors, written, recipe if recipe.exists() else None


# --- the tool -----------------------------------------------------------------------------------------------------


def quantize_checkpoint(
    src: Path | str,
    out: Path | str,
    group_size: int = DEFAULT_GROUP_SIZE,
    backend: str = "llmcompressor",
    force: bool = False,
) -> Path:
    """Write the W4A16 copy of ``src`` into ``out`` and return ``out``."""
    src, out = Path(src).resolve(), Path(out)
    if backend not in BACKENDS:
        raise QuantizeError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    if not src.is_dir():
        raise QuantizeError(f"{src} is not a checkpoint directory")
    config, tensors = load_source(src)
    modules = quantized_modules(tensors)
    _check_group_size(tensors, modules, group_size)
    _prepare_out(out, force)
    ignore = dense_linears(tensors, modules)
    recipe = None
    with tempfile.TemporaryDirectory(prefix="kani-w4a16-") as tmp:
        if backend == "rtn":
            quantized = _rtn_tensors(tensors, modules, group_size)
            block = quantization_config(group_size, ignore, _compressed_tensors_version())
        else:
            quantized, block, recipe_path = _llmcompressor_tensors(src, modules, group_size, Path(tmp))
            block["ignore"] = ignore  # llm-compressor names only the layers of a plain LFM2
            if recipe_path is not None:
                recipe = recipe_path.read_text()
        dense = {name: t for name, t in tensors.items() if name.removesuffix(".weight") not in modules}
        save_file({**dense, **quantized}, out / WEIGHTS_FILE, metadata={"format": "pt"})
    _copy_other_files(src, out)
    if recipe is not None:
        (out / "recipe.yaml").write_text(recipe)
    (out / "config.json").write_text(json.dumps({**config, "quantization_config": block}, indent=2) + "\n")
    return out


def _compressed_tensors_version() -> str:
    try:
        from compressed_tensors import __version__
    except ImportError:
        return "0.17.0"  # the version vLLM 0.26 pins
    return str(__version__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", type=Path, help="dense Kani checkpoint (factory or trained)")
    parser.add_argument("out", type=Path, help="directory to write (created; must be empty unless --force)")
    parser.add_argument(
        "--group-size", type=int, default=DEFAULT_GROUP_SIZE, help="input columns per scale (must divide them)"
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="llmcompressor",
        help="llmcompressor (its oneshot, in its own venv if need be) or rtn (this module's writer, same tensors)",
    )
    parser.add_argument(
        "--llmcompressor-python",
        default=None,
        help=f"python of a venv with llm-compressor (default: ${LLMC_PYTHON_ENV}, else scripts/llmcompressor_env.sh)",
    )
    parser.add_argument("--force", action="store_true", help="write into a non-empty directory")


def run(args: argparse.Namespace) -> int:
    if args.llmcompressor_python:
        os.environ[LLMC_PYTHON_ENV] = args.llmcompressor_python
    try:
        path = quantize_checkpoint(args.src, args.out, args.group_size, args.backend, args.force)
    except QuantizeError as exc:
        print(f"quantize-w4a16: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote a W4A16 (group size {args.group_size}, {args.backend}) checkpoint of {args.src} to {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--llmcompressor-worker"]:  # the subprocess in llm-compressor's venv
        worker = argparse.ArgumentParser(prog="quantize_w4a16 --llmcompressor-worker")
        worker.add_argument("src", type=Path)
        worker.add_argument("work", type=Path)
        worker.add_argument("--group-size", type=int, required=True)
        wargs = worker.parse_args(argv[1:])
        llmcompressor_worker(wargs.src, wargs.work, wargs.group_size)
        return 0
    parser = argparse.ArgumentParser(prog="python -m vllm_omni_kani.tools.quantize_w4a16", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
