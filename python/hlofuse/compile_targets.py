"""Compiling for a TPU or GPU chip on any host: deviceless topologies, per-kernel compiles and their resources.

A chip name (`tpu-v5e`, `tpu-v6e`, `tpu-v5p`, `h100`, `h200`) selects a compile-only device: a TPU topology
from libtpu (`pip install -e ".[tpu]"`) or a CUDA topology built from a GpuTargetConfigProto shipped in
hlofuse/gpu_targets/ (`pip install -e ".[gpu-compiler]"`, or `.[cuda12]` to run on a GPU too).
`check_module(module, chip)` compiles every kernel call in a module (tpu_custom_call, Triton, Mosaic GPU)
alone, then the whole module, with the real compilers (Mosaic, Triton and ptxas), and reads what each
kernel uses from the compilers' own dumps:

- TPU: `LIBTPU_INIT_ARGS=--xla_jf_dump_to=DIR` (set here before libtpu loads): the kernel's scoped VMEM and
  spills from `*-vmem_report.html`, its bundle count from `*-schedule-analysis_final_bundles.txt`;
- GPU: `debug_options.xla_dump_to` per compile: grid, threads and shared memory from `thunk_sequence.txt`,
  registers and spills from `ptxas -v` on the kernel's PTX.

`hlofuse-opt --compile-for=CHIP` prints the result (docs/hlofuse-opt.md).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxlib.mlir import ir

GPU_TARGETS_DIR = Path(__file__).resolve().parent / "gpu_targets"

# Kernel custom calls and the platform they compile for.
KERNEL_TARGETS = {
    "tpu_custom_call": "tpu",
    "__gpu$xla.gpu.triton": "cuda",
    "mosaic_gpu_v2": "cuda",
    "mosaic_gpu": "cuda",
}

# libtpu takes /tmp/libtpu_lockfile when it loads, TPU or not; another process on the host may hold it.
_LIBTPU_MULTIPLE = "ALLOW_MULTIPLE_LIBTPU_LOAD"
# Only the dumps read here: without the filter libtpu writes ~1000 files (50 MB) per small module.
_JF_FILTER = "--xla_jf_dump_llo_pass_label_regex=final_bundles|vmem_report --xla_jf_dump_hlo_text=false"


@dataclass(frozen=True)
class Chip:
    """A chip to compile for: a TPU topology or a GPU target config, and the kernel target that lowers for it."""

    name: str
    platform: str  # "tpu" or "cuda"
    kernel_target: str  # hlofuse-lower-kernels{target=...}
    topology: str
    chips_per_host_bounds: tuple[int, int, int] | None = None
    target_config: str | None = None  # a file in gpu_targets/
    summary: str = ""


CHIPS = {
    chip.name: chip
    for chip in (
        Chip("tpu-v5e", "tpu", "tpu", "v5e:1x1", (1, 1, 1), summary="TPU v5e (v5 lite), one chip"),
        Chip("tpu-v6e", "tpu", "tpu", "v6e:1x1", (1, 1, 1), summary="TPU v6e (Trillium), one chip"),
        Chip("tpu-v5p", "tpu", "tpu", "v5p:1x1x1", (1, 1, 1), summary="TPU v5p, one chip (megacore)"),
        Chip("h100", "cuda", "gpu", "1x1x1", target_config="h100.txtpb", summary="NVIDIA H100 SXM5 80 GB"),
        Chip("h200", "cuda", "gpu", "1x1x1", target_config="h200.txtpb", summary="NVIDIA H200 SXM 141 GB"),
    )
}


class CompilerUnavailable(RuntimeError):
    """The compiler for a chip is not installed here (the message says how to install it)."""


def chip(name: str) -> Chip:
    try:
        return CHIPS[name]
    except KeyError:
        raise ValueError(f"unknown chip '{name}' (known: {', '.join(CHIPS)})") from None


def gpu_target_config(name: str) -> str:
    """The GpuTargetConfigProto text shipped for a GPU chip (`h100`, `h200`)."""
    target = chip(name)
    if target.target_config is None:
        raise ValueError(f"'{name}' is not a GPU chip")
    return (GPU_TARGETS_DIR / target.target_config).read_text()


# ----------------------------------------------------------------------------- topologies

_lock = threading.Lock()
_tpu_dump_dir: str | None = None


def _backends_started() -> bool:
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def prepare(name: str, *, cpu_backends: bool = False) -> None:
    """Sets what must be set before JAX or libtpu start, for a later `topology(name)`; idempotent.

    TPU: allows a second libtpu on the host, and asks libtpu for the dumps read here. With `cpu_backends`
    (hlofuse-opt), JAX's own backends stay on the CPU unless JAX_PLATFORMS says otherwise: a CUDA plugin on
    a host without a GPU fails at cuInit, and a TPU backend would load libtpu before the dump flags are in.
    A library caller on a TPU or GPU host keeps its devices."""
    global _tpu_dump_dir
    target = chip(name)
    import jax
    from jax._src import config
    from jax._src.lib import xla_client

    if cpu_backends and not _backends_started() and not config.jax_platforms.value:
        jax.config.update("jax_platforms", "cpu")
    if target.platform != "tpu":
        return
    os.environ.setdefault(_LIBTPU_MULTIPLE, "1")
    with _lock:
        if _tpu_dump_dir is not None:
            return
        args = os.environ.get("LIBTPU_INIT_ARGS", "")
        given = re.search(r"--xla_jf_dump_to=(\S+)", args)
        if given or xla_client.pjrt_plugin_loaded("tpu"):  # the user's dump, or libtpu started without one
            _tpu_dump_dir = given.group(1) if given else ""
            return
        _tpu_dump_dir = tempfile.mkdtemp(prefix="hlofuse-jf-dump-")
        atexit.register(shutil.rmtree, _tpu_dump_dir, True)
        os.environ["LIBTPU_INIT_ARGS"] = f"{args} --xla_jf_dump_to={_tpu_dump_dir} {_JF_FILTER}".strip()


@functools.cache
def topology(name: str) -> Any:  # noqa: ANN401 - jax.experimental.topologies.TopologyDescription
    """The compile-only topology of one chip; raises CompilerUnavailable when its compiler is missing."""
    target = chip(name)
    prepare(name)
    from jax.experimental import topologies

    if target.platform == "tpu":
        import importlib.util

        if importlib.util.find_spec("libtpu") is None:
            raise CompilerUnavailable(f'{name} needs libtpu: pip install "hlofuse[tpu]" (or jax[tpu]==0.10.2)')
        return topologies.get_topology_desc(
            target.topology, "tpu", chips_per_host_bounds=target.chips_per_host_bounds
        )
    try:
        return topologies.get_topology_desc(
            name, "cuda", target_config=gpu_target_config(name), topology=target.topology
        )
    except NotImplementedError as error:  # no CUDA plugin registered
        raise CompilerUnavailable(
            f'{name} needs the CUDA plugin: pip install "hlofuse[gpu-compiler]" (or jax[cuda12]==0.10.2), and '
            f"JAX_PLATFORMS=cpu on a host without a GPU ({error})"
        ) from None


def device(name: str) -> Any:  # noqa: ANN401 - a compile-only jax Device
    return topology(name).devices[0]


# ----------------------------------------------------------------------------- compiling


@dataclass
class KernelReport:
    """One kernel call compiled alone for a chip."""

    name: str
    target: str  # the custom call target
    location: ir.Location
    ok: bool
    error: str = ""
    resources: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModuleReport:
    """A module compiled for a chip: each kernel alone, then the whole module."""

    chip: str
    kernels: list[KernelReport]
    ok: bool | None  # None: the whole module was not compiled (several devices)
    error: str = ""
    resources: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.ok is False or not all(kernel.ok for kernel in self.kernels)


def kernel_calls(module: ir.Module) -> list[ir.Operation]:
    """The kernel custom calls in `module` (tpu_custom_call, Triton, Mosaic GPU), in program order."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "stablehlo.custom_call" and _call_target(op) in KERNEL_TARGETS:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def _call_target(op: ir.Operation) -> str:
    return ir.StringAttr(op.attributes["call_target_name"]).value


def kernel_name(op: ir.Operation) -> str:
    """The kernel's own name: tpu_custom_call's kernel_name, Triton's backend_config name, else the target."""
    attributes = op.attributes
    if "kernel_name" in attributes:
        return ir.StringAttr(attributes["kernel_name"]).value
    if "mhlo.backend_config" in attributes:
        config = ir.DictAttr(attributes["mhlo.backend_config"])
        if "name" in config:
            return ir.StringAttr(config["name"]).value
    return _call_target(op)


def kernel_module(call: ir.Operation) -> ir.Module:
    """A module whose @main runs `call` alone on arguments of its operand types."""
    from jaxlib.mlir.dialects import func

    context = call.context
    with context, ir.Location.unknown(context):
        module = ir.Module.create()
        module.operation.attributes["sym_name"] = ir.StringAttr.get("hlofuse_kernel")
        with ir.InsertionPoint(module.body):
            types = [operand.type for operand in call.operands]
            main = func.FuncOp("main", ir.FunctionType.get(types, [r.type for r in call.results]))
            main.attributes["sym_visibility"] = ir.StringAttr.get("public")
            block = main.add_entry_block()
            with ir.InsertionPoint(block):
                copy = call.clone()
                for index, argument in enumerate(block.arguments):
                    copy.operands[index] = argument
                func.ReturnOp(list(copy.results))
    return module


def _compile_options(dev: Any, dump_to: str | None) -> Any:  # noqa: ANN401
    from jax._src import compiler

    options = compiler.get_compile_options(num_replicas=1, num_partitions=1, device_assignment=[dev])
    if dump_to:
        options.executable_build_options.debug_options.xla_dump_to = dump_to
    return options


def compile_module(module: ir.Module, name: str, dump_to: str | None = None) -> Any:  # noqa: ANN401
    """The executable XLA compiles from `module` for one chip; raises the compiler's error."""
    from jax._src import compiler
    from jax._src.lib import xla_client

    dev = device(name)
    return compiler.backend_compile_and_load(
        dev.client, module, xla_client.DeviceList((dev,)), _compile_options(dev, dump_to), []
    )


def compiler_message(error: BaseException) -> str:
    """The compiler's own message on one line, without XLA's status prefix noise."""
    text = " ".join(str(error).split())
    return text or type(error).__name__


def _device_count(module: ir.Module) -> int:
    attributes = module.operation.attributes
    count = 1
    for key in ("mhlo.num_partitions", "mhlo.num_replicas"):
        if key in attributes:
            count *= ir.IntegerAttr(attributes[key]).value
    return count


def check_module(module: ir.Module, name: str) -> ModuleReport:
    """Compiles each kernel call of `module` alone, then `module` itself (one device only), for chip `name`."""
    target = chip(name)
    topology(name)  # CompilerUnavailable before any work
    reports = [_check_kernel(call, target) for call in kernel_calls(module)]
    if _device_count(module) > 1:
        return ModuleReport(name, reports, None, f"{_device_count(module)} devices; kernels compiled one by one")
    try:
        executable = compile_module(module, name)
    except Exception as error:
        return ModuleReport(name, reports, False, compiler_message(error))
    stats = executable.get_compiled_memory_stats()
    return ModuleReport(name, reports, True, resources={"temp_bytes": stats.temp_size_in_bytes})


def check_kernels(module: ir.Module, name: str) -> list[KernelReport]:
    """Each kernel call of `module` compiled alone for chip `name` (no whole-module compile)."""
    target = chip(name)
    topology(name)  # CompilerUnavailable before any work
    return [_check_kernel(call, target) for call in kernel_calls(module)]


def _check_kernel(call: ir.Operation, target: Chip) -> KernelReport:
    report = KernelReport(kernel_name(call), _call_target(call), call.location, ok=False)
    wanted = KERNEL_TARGETS[report.target]
    if wanted != target.platform:
        report.error = f"a {wanted} kernel ({report.target}) cannot compile for {target.name}"
        return report
    module = kernel_module(call)
    if target.platform == "tpu":
        before = set(os.listdir(_tpu_dump_dir)) if _tpu_dump_dir and os.path.isdir(_tpu_dump_dir) else set()
        try:
            compile_module(module, target.name)
        except Exception as error:
            report.error = compiler_message(error)
            return report
        report.ok = True
        if _tpu_dump_dir and os.path.isdir(_tpu_dump_dir):
            new = sorted(set(os.listdir(_tpu_dump_dir)) - before)
            report.resources = tpu_resources(_tpu_dump_dir, new)
        return report
    with tempfile.TemporaryDirectory(prefix="hlofuse-xla-dump-") as dump:
        mosaic = os.path.join(dump, "mosaic_gpu")
        os.mkdir(mosaic)
        try:
            with _environment(MOSAIC_GPU_DUMP_TO=mosaic, MOSAIC_GPU_DUMP_PTXAS="1"):
                compile_module(module, target.name, dump_to=dump)
        except Exception as error:
            report.error = compiler_message(error)
            return report
        report.ok = True
        if report.target.startswith("mosaic_gpu"):
            report.name, report.resources = mosaic_gpu_resources(mosaic, report.name)
        else:
            report.resources = gpu_resources(dump, report.name)
    return report


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """Environment variables set for the body (Mosaic GPU reads its dump options at each compile)."""
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# ----------------------------------------------------------------------------- reading the dumps

_KERNEL_HLO = re.compile(r"%(\S+) = [^\n]*custom-call\([^\n]*custom_call_target=\"tpu_custom_call\"")
_BUNDLES = re.compile(r"total scheduled bundles:\s*(\d+)")
_WINDOW = re.compile(r"window allocation for operator (input \d+|output \d+)\. The window shape is (\S+),")


def tpu_resources(dump_dir: str, files: list[str]) -> dict[str, Any]:
    """From one compile's libtpu dump files: the kernel's scoped VMEM, its spills, VMEM capacity, bundles."""
    resources: dict[str, Any] = {}
    reports = [f for f in files if f.endswith("vmem_report.html")]
    analyses = [f for f in files if f.endswith("schedule-analysis_final_bundles.txt")]
    hlo = None
    for file in analyses:
        if "-TLP-" in file:
            found = _KERNEL_HLO.search(Path(dump_dir, file).read_text(errors="replace"))
            hlo = found.group(1) if found else None
    if hlo is None:
        return resources
    for file in analyses:
        if f"-{hlo}-" in file:
            found = _BUNDLES.search(Path(dump_dir, file).read_text(errors="replace"))
            if found:
                resources["bundles"] = int(found.group(1))
    for file in files:
        if f"-{hlo}-" in file and file.endswith("-final_bundles.txt") and "schedule-analysis" not in file:
            resources["inner_loop_bundles"] = inner_loop_bundles(Path(dump_dir, file).read_text(errors="replace"))
    for file in reports:
        data = _vmem_report_data(Path(dump_dir, file).read_text(errors="replace"))
        if not data:
            continue
        resources["vmem_capacity"] = data.get("global_info", {}).get("vmem_capacity")
        breakdown = data.get("hlo_breakdowns", {}).get(hlo)
        if breakdown is not None:
            allocations = [a for block in breakdown.get("blocks", []) for a in block.get("allocations", [])]
            resources["vmem_bytes"] = breakdown.get("total_size", 0)
            resources["vmem_spill_bytes"] = sum(a["size"] for a in allocations if a.get("tag") == "SPILL")
            # Operand and output windows, with every buffering level (2: the pipeline's double buffer).
            windows = [a for a in allocations if "window allocation" in str(a.get("tag", ""))]
            resources["vmem_window_bytes"] = sum(a["size"] for a in windows)
            resources["windows"] = {
                found.group(1): found.group(2)
                for found in (_WINDOW.search(str(a["tag"])) for a in windows)
                if found
            }
    return resources


_BUNDLE_LINE = re.compile(r"^\s*(?:0x[0-9a-f]+|\d+)\s+(?:[A-Z]{2}:|:)\s*(>*)\s*\{", re.MULTILINE)


def inner_loop_bundles(final_bundles: str) -> int:
    """Bundles inside loops nested in the grid loop (libtpu's final_bundles marks each bundle's loop depth
    with '>'; depth 1 is the grid loop): what a kernel's inner loop runs per trip."""
    depths = [len(found.group(1)) for found in _BUNDLE_LINE.finditer(final_bundles)]
    return sum(1 for depth in depths if depth >= 2)


def _vmem_report_data(html: str) -> dict[str, Any] | None:
    """The JSON object libtpu embeds in its vmem_report.html as `const DATA = {...};`."""
    start = html.find("const DATA")
    if start < 0:
        return None
    start = html.find("{", start)
    try:
        data, _ = json.JSONDecoder().raw_decode(html, start)
    except ValueError:
        return None
    return data


_THUNK = re.compile(
    r"\s(\S+) grid: \[(\d+), (\d+), (\d+)\] threads: \[(\d+), (\d+), (\d+)\]\s+shared_memory: (\d+) bytes"
)
_PTXAS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGISTERS = re.compile(r"Used (\d+) registers")


def gpu_resources(dump_dir: str, kernel: str) -> dict[str, Any]:
    """From one compile's XLA dump: the kernel's grid, threads and shared memory; registers and spills by ptxas."""
    resources: dict[str, Any] = {}
    for path in glob.glob(os.path.join(dump_dir, "*.thunk_sequence.txt")):
        for found in _THUNK.finditer(Path(path).read_text(errors="replace")):
            if found.group(1) == kernel:
                resources["grid"] = tuple(int(found.group(i)) for i in (2, 3, 4))
                resources["threads"] = tuple(int(found.group(i)) for i in (5, 6, 7))
                resources["shared_memory_bytes"] = int(found.group(8))
    ptx = _ptx_with_entry(dump_dir, kernel)
    if ptx is None:
        return resources
    ptxas = find_ptxas()
    if ptxas is None:
        resources["ptxas"] = "not found"
        return resources
    arch = re.search(r"^\.target\s+(\S+)", Path(ptx).read_text(errors="replace"), re.MULTILINE)
    result = subprocess.run(
        [ptxas, "-v", f"-arch={arch.group(1) if arch else 'sm_90a'}", ptx, "-o", os.devnull],
        capture_output=True,
        text=True,
        timeout=300,
    )
    resources.update(_ptxas_resources(result.stdout + result.stderr, kernel))
    return resources


def _ptxas_resources(text: str, kernel: str | None = None) -> dict[str, Any]:
    """Registers, stack and spill bytes from `ptxas -v` output (of one entry function when named)."""
    marker = f"entry function '{kernel}'" if kernel else "entry function"
    section = text[text.find(marker) :] if marker in text else text
    resources: dict[str, Any] = {}
    spills, registers = _PTXAS.search(section), _REGISTERS.search(section)
    if registers:
        resources["registers"] = int(registers.group(1))
    if spills:
        resources["stack_bytes"], resources["spill_store_bytes"], resources["spill_load_bytes"] = (
            int(spills.group(i)) for i in (1, 2, 3)
        )
    return resources


_LAUNCH = re.compile(
    r"gpu\.launch[^\n]*?blocks\([^)]*\) in \(([^)]*)\) threads\([^)]*\) in \(([^)]*)\)"
    r"(?: dynamic_shared_memory_size %c(\d+))?"
)
_LAUNCH_DIM = re.compile(r"= %c(\d+)")


def mosaic_gpu_resources(dump_dir: str, default_name: str) -> tuple[str, dict[str, Any]]:
    """(kernel name, resources) from MOSAIC_GPU_DUMP_TO: `<kernel>_N.ptxas` (ptxas -v) and the first IR
    of `<kernel>_N.mlir-passes.log` (its gpu.launch: grid, threads, dynamic shared memory)."""
    ptxas = sorted(glob.glob(os.path.join(dump_dir, "*.ptxas")))
    if not ptxas:
        return default_name, {}
    stem = ptxas[0][: -len(".ptxas")]
    name = re.sub(r"_\d+$", "", os.path.basename(stem))
    resources = _ptxas_resources(Path(ptxas[0]).read_text(errors="replace"))
    log = stem + ".mlir-passes.log"
    if os.path.isfile(log):
        launch = _LAUNCH.search(_first_ir_dump(log))
        if launch:
            grid = [int(v) for v in _LAUNCH_DIM.findall(launch.group(1))]
            threads = [int(v) for v in _LAUNCH_DIM.findall(launch.group(2))]
            if len(grid) == 3 and len(threads) == 3:
                resources["grid"], resources["threads"] = tuple(grid), tuple(threads)
            if launch.group(3):
                resources["shared_memory_bytes"] = int(launch.group(3))
    return name, resources


def _first_ir_dump(path: str) -> str:
    """The log's first IR dump (the kernel as Mosaic GPU received it); the log runs to tens of MB."""
    chunks: list[str] = []
    with open(path, errors="replace") as log:
        for line in log:
            if line.startswith("// -----// IR Dump") and chunks:
                break
            chunks.append(line)
    return "".join(chunks)


def _ptx_with_entry(dump_dir: str, kernel: str) -> str | None:
    entry = re.compile(rf"\.entry\s+{re.escape(kernel)}\s*\(")
    for path in sorted(glob.glob(os.path.join(dump_dir, "*.ptx"))):
        if entry.search(Path(path).read_text(errors="replace")):
            return path
    return None


def find_ptxas() -> str | None:
    """ptxas from the pip CUDA toolkit (nvidia-cuda-nvcc-cu12: the gpu-compiler extra, or jax[cuda12]), else PATH."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for root in list(spec.submodule_search_locations or []) if spec else []:
        candidate = Path(root, "cuda_nvcc", "bin", "ptxas")
        if candidate.is_file():
            return str(candidate)
    return shutil.which("ptxas")


# ----------------------------------------------------------------------------- printing


def _kib(size: int) -> str:
    return f"{size / 1024:.0f} KiB" if size < 1 << 20 else f"{size / (1 << 20):.1f} MiB"


def describe(resources: dict[str, Any]) -> str:
    """Resources as one short phrase: `vmem 808 KiB (spill 424 KiB) of 128.0 MiB, 1546 bundles`, ..."""
    parts = []
    if "vmem_bytes" in resources:
        text = f"vmem {_kib(resources['vmem_bytes'])}"
        inside = [f"{what} {_kib(resources[key])}" for what, key in
                  (("windows", "vmem_window_bytes"), ("spill", "vmem_spill_bytes")) if resources.get(key)]
        if inside:
            text += f" ({', '.join(inside)})"
        if resources.get("vmem_capacity"):
            text += f" of {_kib(resources['vmem_capacity'])}"
        parts.append(text)
    if "bundles" in resources:
        parts.append(f"{resources['bundles']} bundles")
    if "registers" in resources:
        parts.append(f"{resources['registers']} registers")
    if "spill_store_bytes" in resources:
        parts.append(f"spills {resources['spill_store_bytes']} B stored / {resources['spill_load_bytes']} B loaded")
    if "shared_memory_bytes" in resources:
        parts.append(f"shared memory {_kib(resources['shared_memory_bytes'])}")
    if "grid" in resources:
        grid = "x".join(map(str, resources["grid"]))
        threads = resources["threads"][0] * resources["threads"][1] * resources["threads"][2]
        parts.append(f"grid {grid} of {threads} threads")
    if resources.get("ptxas") == "not found":
        parts.append("no ptxas for registers")
    if "temp_bytes" in resources:
        parts.append(f"temp {_kib(resources['temp_bytes'])}")
    return ", ".join(parts) if parts else "no resource dump"


# ----------------------------------------------------------------------------- the table in docs/kernels-pallas.md


@dataclass(frozen=True)
class AttentionCase:
    """One attention shape for the table: q (B, T, N, H), k/v (B, S, K, H)."""

    dtype: str
    b: int
    t: int
    s: int
    n: int
    k: int
    h: int
    causal: bool = True

    @property
    def label(self) -> str:
        heads = f"{self.n}" if self.n == self.k else f"{self.n}/{self.k}"
        return f"{self.dtype} B{self.b} T{self.t} S{self.s} N{heads} H{self.h}" + (" causal" if self.causal else "")


TABLE_CASES = (
    AttentionCase("bf16", 1, 2048, 2048, 8, 8, 128),
    AttentionCase("bf16", 1, 1024, 1024, 32, 8, 128),
    AttentionCase("f32", 1, 1024, 1024, 8, 8, 128),
    AttentionCase("bf16", 1, 1024, 1024, 8, 8, 256),
    AttentionCase("f32", 1, 1024, 1024, 8, 8, 256),
    AttentionCase("bf16", 8, 1, 4096, 32, 8, 128, causal=False),
    AttentionCase("bf16", 1, 32768, 32768, 8, 8, 128),
    AttentionCase("f32", 4, 1, 131072, 32, 8, 256, causal=False),
)
@dataclass(frozen=True)
class SamplerCase:
    """One sampler for the table: `hlofuse.sample` on (rows, V) logits."""

    dtype: str
    rows: int
    vocab: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    @property
    def label(self) -> str:
        knobs = [f"T={self.temperature:g}"] if self.temperature else ["greedy"]
        knobs += [f"k={self.top_k}"] * bool(self.top_k) + [f"p={self.top_p:g}"] * (self.top_p < 1)
        knobs += [f"min_p={self.min_p:g}"] * bool(self.min_p)
        return f"sample {self.dtype} {self.rows}x{self.vocab} " + " ".join(knobs)


TABLE_SAMPLERS = (
    SamplerCase("f32", 8, 32000, temperature=0.7, top_k=50, top_p=0.95),
    SamplerCase("bf16", 16, 128256, temperature=0.6, top_k=40),
    SamplerCase("f32", 8, 256000, temperature=1.0, min_p=0.1),
    SamplerCase("f32", 1, 128256, temperature=0.0),
)
TABLE_TARGETS = (("tpu-v5e", "tpu"), ("tpu-v6e", "tpu"), ("tpu-v5p", "tpu"), ("h100", "gpu"), ("h100", "gpu-mosaic"))


def _case_module(case: AttentionCase, kernel_target: str) -> ir.Module:
    import jax
    import jax.numpy as jnp

    from hlofuse.ir.context import clone_module
    from hlofuse.pipeline import run_pipeline

    dtype = jnp.dtype({"bf16": "bfloat16", "f32": "float32"}[case.dtype])

    def attention(q: Any, k: Any, v: Any) -> Any:  # noqa: ANN401
        q = q.reshape(case.b, case.t, case.k, case.n // case.k, case.h)
        scores = jnp.einsum("btkgh,bskh->bkgts", q, k, preferred_element_type=jnp.float32) * case.h**-0.5
        if case.causal:
            visible = jnp.arange(case.s)[None, :] <= jnp.arange(case.t)[:, None] + (case.s - case.t)
            scores = jnp.where(visible, scores, -jnp.inf)
        probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
        out = jnp.einsum("bkgts,bskh->btkgh", probs, v, preferred_element_type=jnp.float32)
        return out.reshape(case.b, case.t, case.n, case.h).astype(dtype)

    q = jax.ShapeDtypeStruct((case.b, case.t, case.n, case.h), dtype)
    kv = jax.ShapeDtypeStruct((case.b, case.s, case.k, case.h), dtype)
    lowered = jax.jit(attention).lower(q, kv, kv).compiler_ir("stablehlo")
    with lowered.context, ir.Location.unknown():
        module = clone_module(lowered)
        run_pipeline(module, "default", target=kernel_target)
    return module


def _sampler_module(case: SamplerCase, kernel_target: str) -> ir.Module:
    import jax
    import jax.numpy as jnp

    import hlofuse
    from hlofuse.ir.context import clone_module
    from hlofuse.pipeline import run_pipeline

    dtype = jnp.dtype({"bf16": "bfloat16", "f32": "float32"}[case.dtype])

    def sampler(logits: Any, key: Any) -> Any:  # noqa: ANN401
        return hlofuse.sample(logits, key, temperature=case.temperature, top_k=case.top_k, top_p=case.top_p,
                              min_p=case.min_p)

    logits = jax.ShapeDtypeStruct((case.rows, case.vocab), dtype)
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    lowered = jax.jit(sampler).lower(logits, key).compiler_ir("stablehlo")
    with lowered.context, ir.Location.unknown():
        module = clone_module(lowered)
        run_pipeline(module, "default", target=kernel_target)
    return module


def _triton_tiles(case: AttentionCase | SamplerCase, name: str) -> str:
    """The Triton tiles the lowering picks for an attention case on chip `name` ("" for samplers)."""
    if not isinstance(case, AttentionCase):
        return ""
    import jax
    import jax.numpy as jnp

    from hlofuse.kernels.pallas import attention, resources

    dtype = jnp.dtype({"bf16": "bfloat16", "f32": "float32"}[case.dtype])
    q = jax.ShapeDtypeStruct((case.b, case.t, case.n, case.h), dtype)
    kv = jax.ShapeDtypeStruct((case.b, case.s, case.k, case.h), dtype)
    decode = case.t <= attention.DECODE_MAX_T < case.s
    blocks = attention.chip_blocks("gpu", q, kv, kv, decode=decode, chip=resources.CHIPS[name])
    return f"tiles {blocks.block_q}x{blocks.block_k}, "


def _blocks(call: ir.Operation, resources: dict[str, Any]) -> str:
    windows = resources.get("windows", {})
    if windows:  # TPU: the windows as the compiler allocated them (attention: q and k; sampler: logits)
        if "input 2" in windows:
            return f"q {windows['input 1']}, k {windows['input 2']}"
        return f"logits {windows.get('input 1', '?')}"
    if "mhlo.backend_config" in call.attributes:  # Triton: warps and stages from the call
        config = ir.DictAttr(call.attributes["mhlo.backend_config"])
        if "num_warps" in config:
            warps, stages = (ir.IntegerAttr(config[key]).value for key in ("num_warps", "num_stages"))
            return f"{warps} warps, {stages} stage{'s' * (stages != 1)}"
    return "-"


def table(
    cases: tuple[AttentionCase | SamplerCase, ...] = TABLE_CASES + TABLE_SAMPLERS,
    targets: tuple[tuple[str, str], ...] = TABLE_TARGETS,
) -> str:
    """A markdown table: each case lowered for each (chip, kernel target) and its kernels compiled alone."""
    from hlofuse.kernels.pallas import resources as pallas_resources

    for name, _ in targets:
        prepare(name, cpu_backends=True)
    lines = [
        "| case | chip | target | kernel | blocks | compiled | resources |",
        "|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        for name, kernel_target in targets:
            if isinstance(case, SamplerCase) and kernel_target == "gpu-mosaic":
                continue  # the same Triton sampler as target gpu
            build = _sampler_module if isinstance(case, SamplerCase) else _case_module
            with pallas_resources.for_chip(name):  # the chip's own tiles and limits
                module = build(case, kernel_target)  # type: ignore[arg-type]
            calls = kernel_calls(module)
            if not calls:
                lines.append(f"| {case.label} | {name} | {kernel_target} | (kept as a composite) | - | - | - |")
                continue
            for call in calls:
                report = _check_kernel(call, chip(name))
                verdict = "yes" if report.ok else f"**no**: {report.error}"
                resources = describe(report.resources) if report.ok else "-"
                tiles = _triton_tiles(case, name) if report.target == "__gpu$xla.gpu.triton" else ""
                blocks = tiles + _blocks(call, report.resources)
                lines.append(
                    f"| {case.label} | {name} | {kernel_target} | {report.name} | {blocks} "
                    f"| {verdict} | {resources} |"
                )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- TPU tiles by libtpu's static cost

# (block_q, block_k, block_k_inner): whole tiles, and tiles whose kv block the kernel walks in slices.
TUNE_TPU_CANDIDATES = ((128, 128, 0), (128, 256, 0), (128, 512, 0), (128, 1024, 0), (256, 256, 0), (256, 512, 0),
                       (256, 1024, 0), (256, 2048, 0), (512, 512, 0), (512, 1024, 0), (128, 512, 128),
                       (128, 1024, 128), (128, 2048, 128), (128, 1024, 256), (128, 2048, 256), (64, 1024, 128),
                       (64, 2048, 128))  # fmt: skip
TUNE_TPU_SHAPE = (1, 4096, 4096, 1)  # B, T, S, N = K: one grid step's bundles do not depend on B, N or T


def kernel_compile(chip_name: str, backend: str, dtype: str, b: int, t: int, s: int, n: int, k: int, h: int,
                   blocks: Any = None, causal: bool = False) -> KernelReport:  # noqa: ANN401  # fmt: skip
    """hlofuse's Pallas attention at these shapes (and BlockSizes, else the chip's choice) lowered for
    `backend` and compiled alone for `chip_name`."""
    import jax
    import jax.numpy as jnp

    from hlofuse.kernels.pallas import resources
    from hlofuse.kernels.pallas.attention import attention

    jdtype = jnp.dtype({"bf16": "bfloat16", "f32": "float32"}[dtype])

    def fn(q: Any, k_: Any, v: Any) -> Any:  # noqa: ANN401
        return attention(q, k_, v, scale=h**-0.5, causal=causal, backend=backend, block_sizes=blocks)

    q = jax.ShapeDtypeStruct((b, t, n, h), jdtype)
    kv = jax.ShapeDtypeStruct((b, s, k, h), jdtype)
    platform = "tpu" if backend == "tpu" else "cuda"
    with resources.for_chip(chip_name):
        lowered = jax.jit(fn).trace(q, kv, kv).lower(lowering_platforms=(platform,)).compiler_ir("stablehlo")
    (call,) = kernel_calls(lowered)
    return _check_kernel(call, chip(chip_name))


def tune_tpu_blocks(chips: tuple[str, ...] = ("tpu-v5e", "tpu-v6e", "tpu-v5p"),
                    dtypes: tuple[str, ...] = ("bf16", "f32"),
                    head_pads: tuple[int, ...] = (128, 256)) -> dict[str, Any]:  # fmt: skip
    """Bundles of one grid step of the TPU prefill kernel for each candidate tile, chip, dtype and padded head
    dim, from libtpu's schedule analysis: the data in hlofuse/kernels/pallas/tpu_bundles.json."""
    import jax

    from hlofuse.kernels.pallas import resources
    from hlofuse.kernels.pallas.attention import BlockSizes

    for name in chips:
        prepare(name, cpu_backends=True)
    b, t, s, n = TUNE_TPU_SHAPE
    table: dict[str, dict[str, int]] = {}
    spills: dict[str, dict[str, int]] = {}
    for name in chips:
        for dtype in dtypes:
            for head_pad in head_pads:
                row = table.setdefault(f"{name} {dtype} {head_pad}", {})
                spill = spills.setdefault(f"{name} {dtype} {head_pad}", {})
                for bq, bk, inner in TUNE_TPU_CANDIDATES:
                    blocks = BlockSizes(bq, bk, block_k_inner=inner)
                    report = kernel_compile(name, "tpu", dtype, b, t, s, n, n, head_pad, blocks)
                    if report.ok and "bundles" in report.resources:
                        key = resources.tpu_tile_key(bq, bk, inner)
                        trips = bk // inner if inner else 1
                        loop = report.resources.get("inner_loop_bundles", 0) if trips > 1 else 0
                        row[key] = report.resources["bundles"] + (trips - 1) * loop
                        spill[key] = report.resources.get("vmem_spill_bytes", 0)
    import libtpu  # type: ignore[import-not-found]

    return {
        "command": "python -m hlofuse.compile_targets --tune-tpu-blocks --write",
        "compiler": f"jax {jax.__version__}, libtpu {getattr(libtpu, '__version__', '?')}",
        "shape": f"B{b} T{t} S{s} N{n}, not causal, no bias or mask",
        "what": "bundles one grid step of the kernel runs: libtpu's total scheduled bundles (schedule-analysis "
        "dump), plus its inner loop's bundles (final_bundles, loop depth 2) once more per further trip; "
        "spill_bytes: the SPILL allocations of its vmem_report",
        "bundles": table,
        "spill_bytes": spills,
    }


def _tile_text(tile: str) -> str:
    return tile.replace("x", " x ").replace("/", " / ")


def tpu_blocks_table(dtype: str = "bf16", head_pad: int = 128) -> str:
    """Markdown: each candidate TPU tile's bundles per grid step and per 10^4 logits, and its spills, per chip,
    from tpu_bundles.json, with the tile the lowering picks for a causal T = S = 4096 and 32768 (G = 1)."""
    from hlofuse.kernels.pallas import resources

    data = json.loads(resources.TPU_BUNDLES_FILE.read_text())
    chips = sorted({key.split()[0] for key in data["bundles"]})
    lines = ["| tile (block_q x block_k / slice) | " + " | ".join(chips) + " |", "|---|" + "---:|" * len(chips)]
    for bq, bk, inner in TUNE_TPU_CANDIDATES:
        tile = resources.tpu_tile_key(bq, bk, inner)
        cells = []
        for name in chips:
            key = f"{name} {dtype} {head_pad}"
            bundles = data["bundles"].get(key, {}).get(tile)
            spill = data["spill_bytes"].get(key, {}).get(tile, 0)
            per = "" if bundles is None else f"{bundles} ({bundles * 1e4 / (bq * bk):.0f}), spill {_kib(spill)}"
            cells.append(per or "-")
        lines.append(f"| {_tile_text(tile)} | " + " | ".join(cells) + " |")
    for t in (4096, 32768):
        picks = [resources.tpu_blocks(t, t, head_pad, dtype, resources.CHIPS[n], causal_offset=0) for n in chips]
        cells = ["refused" if found is None else _tile_text(resources.tpu_tile_key(*found)) for found, _ in picks]
        lines.append(f"| **picked**, causal T = S = {t} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m hlofuse.compile_targets",
        description="Compile the attention kernels for each chip on this host and print a markdown table "
        "(docs/kernels-pallas.md).",
    )
    parser.add_argument("--chips", default=",".join(dict.fromkeys(n for n, _ in TABLE_TARGETS)),
                        help="comma-separated chips (default: %(default)s)")
    parser.add_argument("--tune-tpu-blocks", action="store_true",
                        help="print the bundles of each candidate TPU tile (the data the TPU tiles are chosen from)")
    parser.add_argument("--write", action="store_true",
                        help="with --tune-tpu-blocks: write hlofuse/kernels/pallas/tpu_bundles.json")
    parser.add_argument("--tpu-blocks-table", action="store_true",
                        help="print tpu_bundles.json as a markdown table (bf16, H = 128) with the tiles picked")
    args = parser.parse_args(argv)
    if args.tpu_blocks_table:
        print(tpu_blocks_table(), end="")
        return 0
    if args.tune_tpu_blocks:
        from hlofuse.kernels.pallas import resources

        text = json.dumps(tune_tpu_blocks(), indent=1, sort_keys=True) + "\n"
        if args.write:
            resources.TPU_BUNDLES_FILE.write_text(text)
        print(text, end="")
        return 0
    wanted = set(args.chips.split(","))
    for name in wanted:
        chip(name)
    print(table(targets=tuple(t for t in TABLE_TARGETS if t[0] in wanted)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
