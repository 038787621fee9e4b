"""raytrain.platform.preload: a module imported on a daemon thread is there for the main thread's own import, and a
module that cannot be imported fails only where the main thread imports it."""

import importlib
import subprocess
import sys
import textwrap

import pytest

from raytrain.platform import preload


def test_a_module_imported_in_the_background_is_the_one_the_main_thread_gets(tmp_path, monkeypatch):
    (tmp_path / "slowmod.py").write_text("import time\ntime.sleep(0.3)\nLOADED = object()\n")
    (tmp_path / "brokenmod.py").write_text("raise RuntimeError('broken on purpose')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    thread = preload.in_background("brokenmod", "slowmod")
    thread.join(10)
    assert not thread.is_alive()
    assert "brokenmod" not in sys.modules  # its failure stopped the thread and nothing else
    with pytest.raises(RuntimeError, match="broken on purpose"):
        importlib.import_module("brokenmod")

    thread = preload.in_background("slowmod")
    module = importlib.import_module("slowmod")  # waits for the thread's import under way, never a second one
    assert module is sys.modules["slowmod"] and hasattr(module, "LOADED")
    thread.join(10)
    sys.modules.pop("slowmod", None)


def test_an_exit_during_a_background_import_waits_for_it(tmp_path):
    """A process that ends (a refused run) while the thread imports exits cleanly after the import."""
    (tmp_path / "slowmod.py").write_text("import time\ntime.sleep(1.0)\nprint('imported', flush=True)\n")
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from raytrain.platform import preload
        preload.in_background("slowmod")
        sys.exit(3)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "imported" in proc.stdout, proc.stderr
