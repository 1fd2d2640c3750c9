"""investigations/moe_load.py on a tiny mixture of experts (CPU): the layout it reports is the
loader's (packed group after group when told to), the weights' bytes are the checkpoint's tensor
bytes (bf16, stacked and fused as they load), and without memory statistics nothing of the
allocator is claimed. The H200 run is scripts/gpu_startup.sh's step moeload."""

from __future__ import annotations

import json

import safetensors.numpy

from investigations.moe_load import main


def test_moe_load_reports_the_layout_and_the_weights(hf_checkpoint, tmp_path, capsys):
  directory = hf_checkpoint("qwen3_moe", dtype="bfloat16")
  out = tmp_path / "moe_load.json"
  argv = ["--model", str(directory), "--layout", "packed", "--group-bytes", str(256 << 10)]
  main([*argv, "--out", str(out)])
  result = json.loads(out.read_text())
  tensors = safetensors.numpy.load_file(directory / "model.safetensors")
  assert result["weight_bytes"] == result["checkpoint_bytes"]
  assert result["weight_bytes"] == sum(t.nbytes for t in tensors.values())
  assert result["layout"].startswith("packed in ") and result["layout"].endswith(" groups")
  assert "in_use_bytes" not in result and "kv_pool_bytes" not in result  # the CPU: no stats
  printed = capsys.readouterr().out
  assert f"layout                     {result['layout']}" in printed
  assert "largest free block         n/a" in printed
  streamed = main(["--model", str(directory), "--no-fuse"])  # auto on a CPU: streaming
  assert streamed["layout"] == "streaming"
  assert streamed["weight_bytes"] == result["weight_bytes"]
