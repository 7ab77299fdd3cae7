"""The package installs, imports cheaply and is discovered by vLLM's plugin loader."""

import subprocess
import sys
from importlib.metadata import entry_points

from tests.conftest import REPO_ROOT


def test_import_is_light():
    code = "import sys, vllm_omni_kani; print('vllm' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    assert out.stdout.split() == ["False", "False"]


def test_entry_point_is_declared():
    names = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert names.get("kani_tts") == "vllm_omni_kani:register"


def test_vllm_loads_the_plugin_and_register_is_idempotent():
    code = (
        "import vllm_omni_kani, vllm.plugins as p\n"
        "p.load_general_plugins()\n"
        "assert vllm_omni_kani._registered\n"
        "vllm_omni_kani.register(); vllm_omni_kani.register()\n"
        "from vllm_omni_kani import patch\n"
        "print('patches', patch.apply_all())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    # On CPU every CPU-guarded patch is active (vLLM 0.26 here).
    assert "keep_narrow_conv_weights_unpacked" in out.stdout
    assert "rotate_flattened_heads_on_cpu" in out.stdout
