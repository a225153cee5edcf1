"""The jax.jit compile hook: options, fallback, strict mode, remarks, persistent cache, threads, plugin."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import logging
import os
import subprocess
import sys
import types
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import cache_key, compilation_cache, compiler, monitoring
from jax._src.interpreters import pxla
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

import hlofuse
import hlofuse.jax as hjax
from hlofuse import pipeline
from hlofuse.jax import hook, plugin
from hlofuse.kernels import cpu

PYTHON_DIR = Path(hlofuse.__file__).resolve().parents[1]
CANON = "builtin.module(canonicalize,cse)"


# ----------------------------------------------------------------------------- test passes


@dataclass(frozen=True)
class MulToAddPass(pipeline.ModulePass):
    """Rewrites every stablehlo.multiply into an add, so a test can tell which module XLA compiled."""

    name: ClassVar[str] = "hlofuse-test-mul-to-add"

    def run(self, module, state):
        muls = []
        module.walk(
            lambda op: (muls.append(op) if op.name == "stablehlo.multiply" else None, ir.WalkResult.ADVANCE)[
                1
            ]
        )
        for op in muls:
            with ir.InsertionPoint(op), op.location:
                add = stablehlo.AddOp(op.operands[0], op.operands[1])
            op.result.replace_all_uses_with(add.result)
            op.erase()
            state.count("mul_to_add")


@dataclass(frozen=True)
class FailPass(pipeline.ModulePass):
    name: ClassVar[str] = "hlofuse-test-fail"

    def run(self, module, state):
        raise RuntimeError("boom")


@dataclass(frozen=True)
class RemarkPass(pipeline.ModulePass):
    name: ClassVar[str] = "hlofuse-test-remark"

    def run(self, module, state):
        module.walk(
            lambda op: (
                state.remark(op, "test near-miss") if op.name == "func.func" else None,
                ir.WalkResult.ADVANCE,
            )[1]
        )


@pytest.fixture(autouse=True)
def hooked(monkeypatch):
    """The hook installed, the test passes registered, and JAX's in-memory caches empty."""
    hjax.install()
    fake = types.ModuleType("hlofuse_test_passes")
    for cls in (MulToAddPass, FailPass, RemarkPass):
        setattr(fake, cls.__name__, cls)
        monkeypatch.setitem(pipeline.PASS_CLASSES, cls.name, f"hlofuse_test_passes:{cls.__name__}")
    monkeypatch.setitem(sys.modules, "hlofuse_test_passes", fake)
    jax.clear_caches()
    yield
    jax.clear_caches()
    hjax.install()


def jit(fn, **options):
    return jax.jit(fn, compiler_options=options)


def double(x):
    return x * 2.0


# ----------------------------------------------------------------------------- hook points


def test_hook_points_are_the_tested_ones():
    # Fails, never skips: a new jax moved the internals the hook patches.
    assert hook.check_hook_points() == []
    original = compiler.compile_or_get_cached._hlofuse_original
    assert tuple(inspect.signature(original).parameters)[:4] == hook.EXPECTED_PARAMETERS
    # pxla looks the function up on the module at call time, so patching the module attribute is enough.
    assert "compiler.compile_or_get_cached(" in inspect.getsource(pxla)
    for name, module in list(sys.modules.items()):
        if name.startswith("jax") and "compile_or_get_cached" in vars(module):
            assert module.compile_or_get_cached is compiler.compile_or_get_cached, name
    assert callable(cache_key.custom_hook) and cache_key.custom_hook._hlofuse_previous is not None


def test_install_is_idempotent():
    wrapper, custom_hook = compiler.compile_or_get_cached, cache_key.custom_hook
    hjax.install()
    assert compiler.compile_or_get_cached is wrapper and cache_key.custom_hook is custom_hook
    assert hjax.is_installed()


def test_no_hlofuse_key_passes_everything_through_untouched():
    seen = []

    def original(*args, **kwargs):
        seen.append((args, kwargs))
        return "executable"

    options = types.SimpleNamespace(env_option_overrides=[("xla_cpu_enable_fast_math", False)])
    wrapper = hook._make_wrapper(original)
    computation, devices = object(), object()
    assert wrapper("backend", computation, devices, options, [], "da", pgle_profiler=None) == "executable"
    ((args, kwargs),) = seen
    assert args[1] is computation and args[2] is devices and args[3] is options
    assert options.env_option_overrides == [("xla_cpu_enable_fast_math", False)]
    assert kwargs == {"pgle_profiler": None}


def test_plain_jit_still_works():
    np.testing.assert_allclose(jax.jit(double)(jnp.ones(3)), 2.0)


# ----------------------------------------------------------------------------- options


def test_upstream_pipeline_runs_and_keys_are_stripped():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = jit(double, hlofuse_pipeline=CANON, hlofuse_target="cpu", hlofuse_strict="1")(jnp.ones(3))
    np.testing.assert_allclose(out, 2.0)


def test_other_compiler_options_reach_xla():
    out = jit(double, hlofuse_pipeline=CANON, xla_cpu_enable_fast_math=False)(jnp.ones(3))
    np.testing.assert_allclose(out, 2.0)
    with pytest.raises(Exception, match="No such compile option"):
        jit(double, hlofuse_pipeline=CANON, xla_no_such_option=True)(jnp.ones(3))


def test_rewritten_clone_is_compiled_and_lowered_module_untouched():
    before = pipeline.STATS["mul_to_add"]
    fn = jit(double, hlofuse_pipeline="builtin.module(hlofuse-test-mul-to-add)")
    lowered = fn.lower(jnp.ones(3))
    np.testing.assert_allclose(lowered.compile()(jnp.ones(3)), 3.0)  # x + 2, not x * 2
    assert "stablehlo.multiply" in lowered.as_text()
    np.testing.assert_allclose(fn(jnp.ones(3)), 3.0)
    assert pipeline.STATS["mul_to_add"] > before


def test_ahead_of_time_compile_takes_the_options():
    lowered = jax.jit(double).lower(jnp.ones(3))
    compiled = lowered.compile({"hlofuse_pipeline": "builtin.module(hlofuse-test-mul-to-add)"})
    np.testing.assert_allclose(compiled(jnp.ones(3)), 3.0)


def test_unknown_hlofuse_option_is_an_error():
    with pytest.raises(ValueError, match="unknown hlofuse compiler option 'hlofuse_pipline'"):
        jit(double, hlofuse_pipline=CANON)(jnp.ones(3))


def test_bad_strict_value_is_an_error():
    with pytest.raises(ValueError, match="hlofuse_strict"):
        jit(double, hlofuse_pipeline=CANON, hlofuse_strict="maybe")(jnp.ones(3))


def test_target_defaults_to_backend_platform_and_can_be_overridden(monkeypatch):
    targets = []
    real = pipeline.run_pipeline

    def spy(module, pipeline_text="default", *, target=None):
        targets.append(target)
        return real(module, pipeline_text, target=target)

    monkeypatch.setattr(pipeline, "run_pipeline", spy)
    jit(double, hlofuse_pipeline=CANON)(jnp.ones(3))
    jit(double, hlofuse_pipeline=CANON, hlofuse_target="tpu")(jnp.ones(3))
    assert targets == [jax.devices()[0].platform, "tpu"]


@pytest.mark.parametrize(
    ("platform", "target"),
    [
        ("cpu", "cpu"),
        ("gpu", "gpu"),
        ("cuda", "gpu"),
        ("rocm", "gpu"),
        ("tpu", "tpu"),
        ("neuron", "neuron"),
        ("METAL", None),
    ],
)
def test_platform_target(platform, target):
    assert hook.platform_target(platform) == target


def test_split_options():
    options, rest = hook.split_options([("hlofuse_pipeline", "default"), ("a", 1), ("hlofuse_strict", True)])
    assert options == hook.HookOptions("default", None, True)
    assert rest == [("a", 1)]
    assert hook.split_options([("a", 1)]) == (None, [("a", 1)])
    for value, strict in [("1", True), ("true", True), (True, True), (1, True), ("0", False), (False, False)]:
        assert hook.split_options([("hlofuse_strict", value)])[0].strict is strict


# ----------------------------------------------------------------------------- fallback and strict


def test_failing_pass_falls_back_to_the_original_module():
    with pytest.warns(hjax.HlofuseFallbackWarning, match=r"pass 'hlofuse-test-fail'.*boom"):
        out = jit(double, hlofuse_pipeline="builtin.module(canonicalize,hlofuse-test-fail)")(jnp.ones(3))
    np.testing.assert_allclose(out, 2.0)


def test_bad_pipeline_string_falls_back():
    with pytest.warns(hjax.HlofuseFallbackWarning, match="no-such-pass"):
        out = jit(double, hlofuse_pipeline="builtin.module(no-such-pass)")(jnp.ones(3))
    np.testing.assert_allclose(out, 2.0)


@pytest.mark.parametrize("strict", ["1", "true", True])
def test_strict_raises(strict):
    with pytest.raises(hjax.HlofuseCompileError, match=r"pass 'hlofuse-test-fail'.*RuntimeError: boom"):
        jit(double, hlofuse_pipeline="builtin.module(hlofuse-test-fail)", hlofuse_strict=strict)(jnp.ones(3))


def test_strict_false_falls_back():
    with pytest.warns(hjax.HlofuseFallbackWarning):
        jit(double, hlofuse_pipeline="builtin.module(hlofuse-test-fail)", hlofuse_strict="false")(jnp.ones(3))


def break_module(module, pipeline_text="default", *, target=None):
    """Stands in for run_pipeline: leaves main without its terminator, which only the verifier catches."""
    main = ir.SymbolTable(module.operation)["main"]
    terminator = list(main.regions[0].blocks[0].operations)[-1]
    terminator.erase()
    return pipeline.PipelineResult([], pipeline.Counter())


def test_module_that_does_not_verify_falls_back(monkeypatch):
    monkeypatch.setattr(pipeline, "run_pipeline", break_module)
    with pytest.warns(hjax.HlofuseFallbackWarning, match="verification"):
        out = jit(double, hlofuse_pipeline=CANON)(jnp.ones(3))
    np.testing.assert_allclose(out, 2.0)
    jax.clear_caches()
    with pytest.raises(hjax.HlofuseCompileError, match="verification"):
        jit(double, hlofuse_pipeline=CANON, hlofuse_strict=True)(jnp.ones(3))


def test_module_xla_rejects_falls_back(monkeypatch):
    def call_missing_kernel(module, pipeline_text="default", *, target=None):
        main = ir.SymbolTable(module.operation)["main"]
        block = main.regions[0].blocks[0]
        ret = list(block.operations)[-1]
        with ir.InsertionPoint(ret), ret.location:
            call = stablehlo.CustomCallOp(
                [ret.operands[0].type],
                [ret.operands[0]],
                call_target_name="hlofuse_test_no_such_kernel",
                api_version=ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 4),
            )
        ret.operands[0] = call.result
        return pipeline.PipelineResult([], pipeline.Counter())

    monkeypatch.setattr(pipeline, "run_pipeline", call_missing_kernel)
    with pytest.warns(hjax.HlofuseFallbackWarning, match="XLA compile of the rewritten module"):
        out = jit(double, hlofuse_pipeline=CANON)(jnp.ones(3))
    np.testing.assert_allclose(out, 2.0)


# ----------------------------------------------------------------------------- remarks


def test_remarks_go_to_logger_and_stderr_when_enabled(monkeypatch, caplog, capfd):
    monkeypatch.setenv("HLOFUSE_REMARKS", "1")
    with caplog.at_level(logging.INFO, logger="hlofuse"):
        jit(double, hlofuse_pipeline="builtin.module(hlofuse-test-remark)")(jnp.ones(3))
    assert any(
        "test near-miss" in r.getMessage() and "hlofuse-test-remark" in r.getMessage() for r in caplog.records
    )
    assert "test near-miss" in capfd.readouterr().err


def test_remarks_quiet_by_default(monkeypatch, caplog, capfd):
    monkeypatch.delenv("HLOFUSE_REMARKS", raising=False)
    with caplog.at_level(logging.INFO, logger="hlofuse"):
        jit(double, hlofuse_pipeline="builtin.module(hlofuse-test-remark)")(jnp.ones(3))
    assert not any("test near-miss" in r.getMessage() for r in caplog.records)
    assert "test near-miss" not in capfd.readouterr().err


# ----------------------------------------------------------------------------- persistent cache


@pytest.fixture
def persistent_cache(tmp_path):
    names = (
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes",
        "jax_enable_compilation_cache",
    )
    saved = {name: getattr(jax.config, name) for name in names}
    hits = []

    def on_event(event, **kwargs):
        if event == "/jax/compilation_cache/cache_hits":
            hits.append(event)

    compilation_cache.reset_cache()
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    monitoring.register_event_listener(on_event)
    try:
        yield tmp_path, hits
    finally:
        monitoring.unregister_event_listener(on_event)
        for name, value in saved.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


def test_persistent_cache_key_covers_hlofuse(persistent_cache):
    cache_dir, hits = persistent_cache

    def entries():
        return len(list(cache_dir.glob("jit_f-*-cache")))

    def f(x):
        return jnp.sin(x) * 3.0

    x = jnp.ones(8)
    jax.jit(f)(x)
    assert entries() == 1
    jit(f, hlofuse_pipeline=CANON)(x)
    assert entries() == 2, "a hlofuse compile must not share the plain compile's entry"
    jax.clear_caches()
    jit(f, hlofuse_pipeline=CANON)(x)
    assert entries() == 2 and len(hits) == 1, "an identical hlofuse compile must hit the cache"
    jax.clear_caches()
    jit(f, hlofuse_pipeline="builtin.module(cse)")(x)
    assert entries() == 3, "another pipeline is another entry"
    jax.clear_caches()
    with pytest.warns(hjax.HlofuseFallbackWarning):
        jit(f, hlofuse_pipeline="builtin.module(hlofuse-test-fail)")(x)
    assert entries() == 3 and len(hits) == 2, "a fallback compiles exactly the plain program"


def test_cache_key_hook_chains_the_previous_one():
    hjax.uninstall()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(cache_key, "custom_hook", lambda: "user-salt")
            hjax.install()
            assert cache_key.custom_hook() == "user-salt"
            salt = hook.cache_salt(hook.HookOptions(CANON, None, False), "cpu")
            assert hlofuse.__version__ in salt and CANON in salt and "cpu" in salt
            assert f"kernels={cpu.library_digest()};" in salt  # a rebuilt kernel library misses the cache
            hook._local.salt = salt
            assert cache_key.custom_hook() == f"user-salt|{salt}"
            hook._local.salt = None
            hjax.uninstall()
            assert cache_key.custom_hook() == "user-salt"
    finally:
        hook._local.salt = None
        hjax.install()
    assert hjax.is_installed() and cache_key.custom_hook() == ""


def test_install_restores_a_clobbered_cache_key_hook(monkeypatch):
    monkeypatch.setattr(cache_key, "custom_hook", lambda: "")
    assert not hjax.is_installed()
    hjax.install()
    assert hjax.is_installed()


# ----------------------------------------------------------------------------- threads


def test_concurrent_compiles_from_threads():
    def compile_and_run(k):
        def fn(x):
            return x * float(k) + float(k)

        x = jnp.full((4,), 1.0)
        if k % 3 == 0:
            return k, jax.jit(fn)(x), 1.0 * k + k
        if k % 3 == 1:
            return k, jit(fn, hlofuse_pipeline=CANON)(x), 1.0 * k + k
        return k, jit(fn, hlofuse_pipeline="builtin.module(hlofuse-test-mul-to-add)")(x), 1.0 + k + k

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(compile_and_run, range(12)))
    for k, out, want in results:
        np.testing.assert_allclose(out, want, err_msg=f"function {k}")


# ----------------------------------------------------------------------------- version guard


def test_untested_jax_warns_once_and_does_not_install():
    hjax.uninstall()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jax, "__version__", "0.99.0")
        patch.setattr(plugin, "_warned", False)
        assert any("0.99.0" in problem for problem in hook.check_hook_points())
        with pytest.warns(RuntimeWarning, match="not installed.*0.99.0"):
            plugin.initialize()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            plugin.initialize()
        assert not hjax.is_installed()
        with pytest.raises(hjax.HlofuseHookError):
            hjax.install()
        patch.setenv("HLOFUSE_ALLOW_UNTESTED_JAX", "1")
        assert hook.check_hook_points() == []


def test_moved_hook_point_is_detected():
    hjax.uninstall()

    def compile_or_get_cached(computation, backend, compile_options):
        raise AssertionError("never called")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiler, "compile_or_get_cached", compile_or_get_cached)
        assert any("compile_or_get_cached takes" in problem for problem in hook.check_hook_points())
        patch.delattr(cache_key, "custom_hook")
        assert any("custom_hook is missing" in problem for problem in hook.check_hook_points())
    assert hook.check_hook_points() == []


def test_plugin_initialize_installs():
    hjax.uninstall()
    assert not hjax.is_installed()
    plugin.initialize()
    plugin.initialize()
    assert hjax.is_installed()
    np.testing.assert_allclose(jit(double, hlofuse_pipeline=CANON)(jnp.ones(3)), 2.0)


# ----------------------------------------------------------------------------- no import needed

NO_IMPORT = (
    "import sys, jax, jax.numpy as jnp\n"
    "print(jax.jit(lambda x: x*2, compiler_options={'hlofuse_pipeline': 'builtin.module(canonicalize)'})"
    "(jnp.ones(3)))\n"
    "bad = {'hlofuse_pipeline': 'builtin.module(no-such-pass)'}\n"
    "jax.jit(lambda x: x*3, compiler_options=bad)(jnp.ones(3))\n"
)


def run_python(code, env):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def check_no_import_run(result):
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[2. 2. 2.]"
    assert "HlofuseFallbackWarning" in result.stderr  # the hook, not XLA, handled the bad pipeline
    assert "configuration error" not in result.stderr


def test_installed_entry_point_needs_no_import():
    points = [
        p for p in importlib.metadata.entry_points(group="jax_plugins") if p.value == "hlofuse.jax.plugin"
    ]
    if not points:
        pytest.skip("hlofuse is not installed with its jax_plugins entry point (pip install -e .)")
    check_no_import_run(run_python(NO_IMPORT, {}))


def test_entry_point_through_a_temporary_registration(tmp_path):
    # The same discovery JAX does for an installed package, from a dist-info made here.
    dist = tmp_path / "hlofuse_entry_probe-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hlofuse-entry-probe\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text("[jax_plugins]\nhlofuse = hlofuse.jax.plugin\n")
    path = os.pathsep.join([str(PYTHON_DIR), str(tmp_path), os.environ.get("PYTHONPATH", "")])
    check_no_import_run(run_python(NO_IMPORT, {"PYTHONPATH": path}))


# A deviceless TPU compile loads libtpu by itself and starts JAX's backends (and so the jax_plugins entry
# point) only inside compile_or_get_cached: the hook must already be there, armed at `import jax`.
FIRST_COMPILE_DEVICELESS_TPU = """
import sys, jax, jax.numpy as jnp
from jax.experimental import topologies
topo = topologies.get_topology_desc("v5e:1x1", "tpu", chips_per_host_bounds=(1, 1, 1))
jax.config.update("jax_default_device", topo.devices[0])
sharding = jax.sharding.SingleDeviceSharding(topo.devices[0])
x = jax.ShapeDtypeStruct((2, 128, 4, 128), jnp.float32, sharding=sharding)
def attention(q, k, v):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
options = {"hlofuse_pipeline": "default", "hlofuse_strict": True}
compiled = jax.jit(attention, compiler_options=options).lower(x, x, x).compile()
print("tpu_custom_call" in compiled.as_text())
"""


def installed_with_entry_point():
    return any(p.value == "hlofuse.jax.plugin" for p in importlib.metadata.entry_points(group="jax_plugins"))


def test_first_compile_deviceless_tpu_needs_no_import():
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip('libtpu is not installed (pip install -e ".[tpu]")')
    if not installed_with_entry_point():
        pytest.skip("hlofuse is not installed (pip install -e .)")
    # libtpu takes /tmp/libtpu_lockfile even without a TPU; other processes on a shared host may hold it.
    result = run_python(FIRST_COMPILE_DEVICELESS_TPU, {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "True", "the attention was not lowered to the Mosaic kernel"


FIRST_COMPILE_DEVICELESS_GPU = """
import sys, jax, jax.numpy as jnp
from jax.experimental import topologies
config = open(sys.argv[1]).read()
topo = topologies.get_topology_desc("h100", "cuda", target_config=config, topology="1x1x1")
sharding = jax.sharding.SingleDeviceSharding(topo.devices[0])
x = jax.ShapeDtypeStruct((2, 128, 4, 64), jnp.float32, sharding=sharding)
def attention(q, k, v):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
pipeline = "builtin.module(hlofuse-prepare,hlofuse-fuse-attention,hlofuse-lower-kernels{target=gpu})"
options = {"hlofuse_pipeline": pipeline, "hlofuse_strict": True}
compiled = jax.jit(attention, compiler_options=options).lower(x, x, x).compile()
print("hlofuse_flash_attention_gpu" in compiled.as_text())
"""


def test_first_compile_deviceless_gpu_needs_no_import():
    # A CUDA topology starts JAX's backends (get_topology_desc -> make_pjrt_topology), so the entry point
    # alone covered this one; it stays covered now that the hook comes at `import jax`.
    try:
        cuda_plugin = importlib.util.find_spec("jax_plugins.xla_cuda12")
    except ModuleNotFoundError:  # no jax_plugins package at all
        cuda_plugin = None
    if cuda_plugin is None:
        pytest.skip('the CUDA plugin is not installed (pip install -e ".[gpu-compiler]")')
    if not installed_with_entry_point():
        pytest.skip("hlofuse is not installed (pip install -e .)")
    config = PYTHON_DIR / "hlofuse" / "gpu_targets" / "h100.txtpb"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    command = [sys.executable, "-c", FIRST_COMPILE_DEVICELESS_GPU, str(config)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "True", "the attention was not lowered to the Triton kernel"


def test_startup_finder_installs_the_hook_at_import_jax():
    # What hlofuse-jax.pth does, in a process that has not imported jax: the hook is in place right after
    # `import jax`, with the backends (and so the entry point) not started.
    code = (
        f"import sys; sys.path.insert(0, {str(PYTHON_DIR)!r})\n"
        "import hlofuse.jax.startup as s; s.arm()\n"
        "import jax\n"
        "from jax._src import compiler, xla_bridge\n"
        "print(hasattr(compiler.compile_or_get_cached, '_hlofuse_original'), xla_bridge._plugins_registered,\n"
        "      any(isinstance(f, s.InstallAfterJaxImport) for f in sys.meta_path))\n"
    )
    result = run_python(code, {"HLOFUSE_STARTUP_HOOK": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "False", "False"]
    disabled = run_python(code, {"HLOFUSE_STARTUP_HOOK": "0"})
    assert disabled.stdout.split() == ["False", "False", "False"], disabled.stderr


def test_startup_finder_leaves_a_find_spec_without_import_alone():
    # importlib.util.find_spec("jax") alone must not disarm it: the hook still comes with the real import.
    code = (
        f"import sys, importlib.util; sys.path.insert(0, {str(PYTHON_DIR)!r})\n"
        "import hlofuse.jax.startup as s; s.arm()\n"
        "assert importlib.util.find_spec('jax') is not None and 'jax' not in sys.modules\n"
        "import jax\n"
        "from jax._src import compiler\n"
        "print(hasattr(compiler.compile_or_get_cached, '_hlofuse_original'), type(jax.__spec__.loader).__name__)\n"
    )
    result = run_python(code, {})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "SourceFileLoader"]


# ----------------------------------------------------------------------------- the default pipeline


def attention(q, k, v):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


def needs_passes(*modules):
    """Skips while a pass the pipeline names is not written yet; turns on by itself once it imports."""
    for module in ("hlofuse.passes.fuse_attention", *modules):
        pytest.importorskip(module)


def random_qkv():
    keys = jax.random.split(jax.random.key(0), 3)
    return [jax.random.normal(key, (2, 16, 4, 32), jnp.float32) for key in keys]


def compile_capturing_rewrite(monkeypatch, fn, args, pipeline_text):
    """(result, rewritten module text) of a strict hlofuse compile; fails on any fallback."""
    rewritten = []
    real = hook.rewrite_module

    def spy(computation, pipeline_arg, target):
        module, result = real(computation, pipeline_arg, target)
        rewritten.append(str(module))
        return module, result

    monkeypatch.setattr(hook, "rewrite_module", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("error", hjax.HlofuseFallbackWarning)
        out = jit(fn, hlofuse_pipeline=pipeline_text, hlofuse_strict=True)(*args)
    assert len(rewritten) == 1
    return out, rewritten[0]


def test_fuse_attention_through_jit(monkeypatch):
    needs_passes("hlofuse.passes.prepare")
    q, k, v = random_qkv()
    want = jax.jit(attention)(q, k, v)
    pipeline_text = "builtin.module(hlofuse-prepare,hlofuse-fuse-attention)"
    got, text = compile_capturing_rewrite(monkeypatch, attention, (q, k, v), pipeline_text)
    assert '"hlofuse.attention"' in text
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)


def test_default_pipeline_on_a_program_without_attention(monkeypatch):
    needs_passes("hlofuse.passes.prepare", "hlofuse.passes.lower_kernels")
    out, _ = compile_capturing_rewrite(monkeypatch, double, (jnp.ones(3),), "default")
    np.testing.assert_allclose(out, 2.0)


def test_default_pipeline_fuses_attention_and_matches(monkeypatch):
    needs_passes("hlofuse.passes.prepare", "hlofuse.passes.lower_kernels")
    q, k, v = random_qkv()
    want = jax.jit(attention)(q, k, v)
    got, text = compile_capturing_rewrite(monkeypatch, attention, (q, k, v), "default")
    assert "hlofuse" in text
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
