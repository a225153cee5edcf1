"""hlofuse-report's model: FLOP and byte counting of small programs (FLOPs against XLA's cost analysis on the
CPU), the region grouping, the kernel models, the JSON schema and the sign of --compare on GQA decode.

Everything here runs with the table's host fallbacks (calibrate=False): no calibration, no timing."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlofuse.report import hardware, kernels, report
from hlofuse.report.model import analyze, prepare, total_flops
from hlofuse.report.regions import form_regions
from hlofuse.report.render import compare_json, to_html, to_json

X = jnp.ones((256, 512), jnp.float32)
W = jnp.ones((512, 128), jnp.float32)


def _xla_cost(fn, *args) -> dict[str, float]:
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    if isinstance(cost, list):
        cost = cost[0]
    return cost


def _module(fn, *args):
    return jax.jit(fn).lower(*args).compiler_ir("stablehlo")


def _layernorm(a):
    return (a - a.mean(-1, keepdims=True)) * jax.lax.rsqrt(a.var(-1, keepdims=True) + 1e-5)


# Programs whose FLOPs XLA's cost analysis counts right (no loops: XLA counts a while body once).
XLA_COUNTED = {
    "matmul": (lambda a, b: a @ b, (X, W)),
    "batched_matmul": (lambda a: jnp.einsum("bij,bkj->bik", a, a), (jnp.ones((4, 64, 32)),)),
    "elementwise": (lambda a: jnp.tanh(a * 2 + 1) - a / 3, (X,)),
    "softmax": (lambda a: jax.nn.softmax(a, -1), (X,)),
    "reductions": (lambda a: a.sum(0) + a.max(1).sum(), (X,)),
    "gelu_mlp": (lambda a, b: jax.nn.gelu(a @ b), (X, W)),
    "layernorm": (_layernorm, (X,)),
    "argmax": (lambda a: jnp.argmax(a, -1), (X,)),
    "cumsum": (lambda a: jnp.cumsum(a, -1), (jnp.ones((8, 4096)),)),
}


@pytest.mark.parametrize("name", sorted(XLA_COUNTED))
def test_flops_match_xla_cost_analysis(name):
    fn, args = XLA_COUNTED[name]
    xla = _xla_cost(fn, *args)
    ours = total_flops(_module(fn, *args))
    rel = 1e-2 if name == "cumsum" else 1e-3  # a scan is ~17 ops an element after XLA rewrites it, not exactly
    assert ours["flops"] + ours["mxu_flops"] == pytest.approx(xla.get("flops", 0.0), rel=rel)
    assert ours["transcendentals"] == pytest.approx(xla.get("transcendentals", 0.0), rel=1e-3, abs=1)


def test_loops_count_every_trip():
    """XLA's cost analysis counts a while body once; the model counts it as many times as it runs."""
    def fn(a, b):
        return jax.lax.fori_loop(0, 5, lambda i, c: jnp.tanh(c @ b) @ b.T, a)

    body = total_flops(_module(lambda a, b: jnp.tanh(a @ b) @ b.T, X, W))
    looped = total_flops(_module(fn, X, W))
    assert looped["mxu_flops"] == pytest.approx(5 * body["mxu_flops"])
    assert looped["transcendentals"] == pytest.approx(5 * body["transcendentals"])

    def scan(a, ws):
        return jax.lax.scan(lambda c, w: (c @ w, None), a, ws)[0]

    scanned = total_flops(_module(scan, jnp.ones((4, 128)), jnp.ones((6, 128, 128))))
    assert scanned["mxu_flops"] == pytest.approx(6 * 2 * 4 * 128 * 128)


def _regions(fn, *args, family="cpu"):
    prepared = prepare(_module(fn, *args), fuse=False)
    return prepared.base, form_regions(prepared.base, family)


def test_elementwise_chain_is_one_region_reading_inputs_once():
    graph, regions = _regions(lambda a, b: jnp.tanh(a * b + 1.0) * 2.0, X, X)
    assert [r.kind for r in regions] == ["loop"]
    assert regions[0].bytes_read == 2 * X.nbytes
    assert regions[0].bytes_written == X.nbytes


def test_softmax_is_four_passes_on_cpu_and_one_on_gpu():
    """XLA CPU: max, exp (two consumers, not duplicated), sum, divide; XLA GPU fuses the reductions (Triton)."""
    _, cpu = _regions(lambda a: jax.nn.softmax(a, -1), X)
    assert sorted(r.kind for r in cpu) == ["loop", "loop", "reduce", "reduce"]
    _, gpu = _regions(lambda a: jax.nn.softmax(a, -1), X, family="gpu")
    assert len(gpu) == 1
    assert gpu[0].bytes_read == X.nbytes and gpu[0].bytes_written == X.nbytes


def test_dot_is_its_own_region_and_absorbs_a_transpose():
    graph, regions = _regions(lambda a, b: (a @ b.T.T) + 1.0, X, W)
    kinds = sorted(r.kind for r in regions)
    assert kinds == ["dot", "loop"]
    dot = next(r for r in regions if r.kind == "dot")
    assert dot.mxu_flops == 2 * 256 * 512 * 128
    assert dot.bytes_read == X.nbytes + W.nbytes


def test_a_slice_reads_only_what_it_touches():
    cache = jnp.ones((32, 1024, 128), jnp.float32)
    _, regions = _regions(lambda c, i: jax.lax.dynamic_index_in_dim(c, i, keepdims=False) * 2.0, cache, jnp.int32(3))
    assert len(regions) == 1
    assert regions[0].bytes_read == pytest.approx(1024 * 128 * 4 + 4)


def test_dynamic_update_slice_writes_the_update_in_place():
    cache = jnp.ones((32, 1024, 128), jnp.float32)
    update = jnp.ones((1, 1024, 128), jnp.float32)
    _, regions = _regions(lambda c, u, i: jax.lax.dynamic_update_slice(c, u, (i, 0, 0)), cache, update, jnp.int32(3))
    assert len(regions) == 1
    assert regions[0].bytes_written == update.nbytes
    assert regions[0].bytes_read == pytest.approx(update.nbytes + 4)


# ---- kernel models ----------------------------------------------------------------------------------------


def test_visible_fraction_of_causal_and_window_bands():
    assert kernels.visible_fraction(4096, 4096, 128, 128, {}) == 1.0
    causal = kernels.visible_fraction(4096, 4096, 128, 128, {"causal": True, "window_right": 0})
    assert causal == pytest.approx(0.5, abs=0.02)
    window = kernels.visible_fraction(4096, 4096, 128, 128, {"window_left": 256, "window_right": 0})
    assert window == pytest.approx(3 / 32, abs=0.01)


def test_decode_attention_is_bound_by_kv_bytes():
    chip = hardware.load_table()["h100"]
    types = (((1, 1, 32, 128), "bf16"), ((1, 8192, 8, 128), "bf16"), ((1, 8192, 8, 128), "bf16"))
    cost = kernels.attention_cost(chip, {"decode": True, "num_heads": 32, "num_kv_heads": 8}, types,
                                  (((1, 1, 32, 128), "bf16"),))
    kv = 2 * 8192 * 8 * 128 * 2
    assert cost.bytes == pytest.approx(kv, rel=0.01)
    assert cost.memory_s > cost.compute_s


def test_sampler_reads_the_logits_once_or_twice():
    chip = hardware.load_table()["tpu-v5e"]
    top_k = kernels.sample_cost(chip, {"mode": "top_k"}, (((8, 131072), "f32"),), (((8,), "i32"),))
    top_p = kernels.sample_cost(chip, {"mode": "top_p"}, (((8, 131072), "f32"),), (((8,), "i32"),))
    logits = 8 * 131072 * 4
    assert top_k.bytes == pytest.approx(logits, rel=0.01)
    assert top_p.bytes == pytest.approx(2 * logits, rel=0.01)


def test_every_number_in_the_table_has_a_source():
    for chip in hardware.load_table().values():
        for key, source in chip.sources.items():
            assert source, f"{chip.name}.{key} has no source"
        assert chip.peak("bf16") > 0 and chip.hbm_bw > 0
    table = hardware.load_table()
    assert table["tpu-v5e"].peak("bf16") == 197e12 and table["tpu-v5e"].hbm_bw == 819e9
    assert table["h100"].hbm_bw == 3.35e12 and table["h200"].hbm_bw == 4.8e12
    assert hardware.resolve_targets("cpu,v5e") == ["host", "tpu-v5e"]
    with pytest.raises(ValueError, match="unknown target"):
        hardware.resolve_targets("tpu-v9")


# ---- reports ----------------------------------------------------------------------------------------------


def _attention(q, k, v):
    groups = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    s = jnp.einsum("btnh,bsnh->bnts", q, k) / np.float32(np.sqrt(q.shape[-1]))
    return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(s, axis=-1), v)


TARGETS = "host,tpu-v5e,h100,trn2"


def _decode(kv_heads: int):
    q = jnp.ones((1, 1, 32, 128), jnp.float32)
    k = jnp.ones((1, 2048, kv_heads, 128), jnp.float32)
    return analyze(_module(_attention, q, k, k), TARGETS, calibrate=False, program=f"decode kv{kv_heads}")


def test_json_schema():
    q = jnp.ones((1, 256, 8, 64), jnp.float32)
    rep = report(_attention, q, q, q, targets=TARGETS, calibrate=False)
    data = json.loads(to_json(rep))
    assert set(data["targets"]) == set(TARGETS.split(","))
    for name, target in data["targets"].items():
        assert target["predicted_s"] > 0, name
        assert target["regions"], name
        for region in target["regions"]:
            for key in ("name", "flops", "bytes", "bound", "predicted_s", "share"):
                assert key in region, (name, key)
            assert region["bound"] in ("compute", "memory", "overhead", "interconnect")
        assert 0.9 < sum(r["share"] for r in target["regions"]) <= 1.0 + 1e-9
        assert len(target["fusions"]) == 1
        fusion = target["fusions"][0]
        assert {"site", "unfused_s", "fused_s"} <= set(fusion)
        assert fusion["unfused_s"] > 0 and fusion["fused_s"] > 0
        assert isinstance(target["next"], list)
    assert "measured" not in data


def test_fused_attention_beats_its_decomposition_where_it_matters():
    """A prefill big enough that the (T, S) scores dominate: every target predicts a gain for its kernel."""
    q = jnp.ones((1, 2048, 8, 64), jnp.float32)
    rep = report(_attention, q, q, q, targets="tpu-v5e,h100,trn2", calibrate=False)
    for target in rep.targets.values():
        fusion = target.fusions[0]
        assert fusion.fused_s < fusion.unfused_s, target.name
        assert fusion.status in ("kernel", "modelled")


def test_compare_gqa_decode_8_vs_2_kv_heads():
    """Decode reads the KV cache: 2 KV heads read a quarter of what 8 do, with the same FLOPs, so B - A < 0 on
    every accelerator (memory-bound there), and never > 0 (the uncalibrated host's fallback ceilings make its
    kernel compute-bound, where the KV heads do not matter)."""
    a, b = _decode(8), _decode(2)
    data = compare_json(a, b)
    assert set(data["targets"]) == set(TARGETS.split(","))
    for name, target in data["targets"].items():
        assert target["delta_s"] <= 0, name
        if name == "host":
            continue
        assert target["delta_s"] < 0, name
        assert target["b_s"] < target["a_s"]
        kernel_rows = [r for r in target["regions"] if r["kind"] == "kernel"]
        assert kernel_rows and sum(r["delta_s"] for r in kernel_rows) < 0


def test_unfused_model_has_no_sites():
    q = jnp.ones((1, 256, 8, 64), jnp.float32)
    rep = report(_attention, q, q, q, targets="host", fuse=False, calibrate=False)
    assert rep.sites == 0 and not rep.targets["host"].fusions
    assert any(r.kind == "dot" for r in rep.targets["host"].regions)


def test_html_is_one_offline_page():
    q = jnp.ones((1, 256, 8, 64), jnp.float32)
    page = to_html(report(_attention, q, q, q, targets="host,h100", calibrate=False))
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") >= 3
    for external in ("<script src", "<link", "url(http", 'src="http'):
        assert external not in page


def test_measure_times_the_program_on_this_host():
    rep = report(lambda a, b: a @ b, X, W, targets="host", measure=True, calibrate=False, runs=2)
    host = rep.measured["host"]
    assert host["measured_s"] > 0 and host["best_s"] <= host["measured_s"]
    assert not math.isnan(rep.targets["host"].predicted_s)


SHARDED_MLP = """
module @jit_mlp attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["data"=2, "model"=4]>
  func.func public @main(%x: tensor<64x1024xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>},
                         %w1: tensor<1024x4096xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}]>},
                         %w2: tensor<4096x1024xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"model"}, {}]>})
      -> tensor<64x1024xf32> {
    %0 = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0]
        : (tensor<64x1024xf32>, tensor<1024x4096xf32>) -> tensor<64x4096xf32>
    %1 = stablehlo.tanh %0 : tensor<64x4096xf32>
    %2 = stablehlo.dot_general %1, %w2, contracting_dims = [1] x [0]
        : (tensor<64x4096xf32>, tensor<4096x1024xf32>) -> tensor<64x1024xf32>
    return %2 : tensor<64x1024xf32>
  }
}
"""


def test_sharded_module_uses_per_device_shapes_and_all_reduces_partial_sums():
    from hlofuse.ir.context import parse_module

    module = parse_module(SHARDED_MLP)
    per_device = total_flops(module)
    assert per_device["mxu_flops"] == pytest.approx(2 * (2 * 64 * 1024 * 4096) / 8)
    rep = analyze(module, "tpu-v5e", calibrate=False)
    assert rep.devices == 8
    rows = rep.targets["tpu-v5e"].regions
    collective = [r for r in rows if r.kind == "collective"]
    assert len(collective) == 1  # the second dot contracts the sharded dim: its partial sums are all-reduced
    local_out = 32 * 1024 * 4
    assert collective[0].collective_s == pytest.approx(local_out * 2 * 0.75 / 400e9)


@pytest.mark.parametrize("setting", ["off", "folder"])
def test_host_calibration_keeps_to_the_cache_setting(tmp_path, monkeypatch, setting):
    """HLOFUSE_CACHE_DIR=off keeps no calibration (and no folder named `off`); a folder keeps it there."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "cache"
    monkeypatch.setenv("HLOFUSE_CACHE_DIR", "off" if setting == "off" else str(folder))
    calls = []
    monkeypatch.setattr(hardware, "calibrate", lambda verbose=False: calls.append(1) or {"version": 0})
    assert hardware.host_calibration(allow=False) is None
    assert hardware.host_calibration()["version"] == 0
    hardware.host_calibration()
    if setting == "off":
        assert len(calls) == 2 and sorted(p.name for p in tmp_path.iterdir()) == []
    else:
        assert len(calls) == 1 and len(list(folder.glob("report-host-*.json"))) == 1
