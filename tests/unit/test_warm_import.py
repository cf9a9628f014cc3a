"""The checkpoint writers' deferred import of DCP (`WarmImport`): nothing is imported until the
run asks for it or a message needs it, and the import runs at the priority it is given."""

from __future__ import annotations

import os
import sys
import textwrap
import threading

import pytest

from ray_resilience._internal.checkpoint.service.warm_import import WarmImport, dumps

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def probe_module(tmp_path, monkeypatch):
    """A module that records, when imported, the nice value of the thread importing it."""
    name = f"rr_warm_probe_{os.getpid()}_{threading.get_ident()}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        import os, threading
        NICE = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        THREAD = threading.current_thread().name

        class Box:
            def __init__(self, value):
                self.value = value
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_nothing_is_imported_until_started(probe_module):
    warm = WarmImport(probe_module)
    assert warm.state == "deferred" and warm.started_at is None
    assert probe_module not in sys.modules
    warm.start()
    warm.start()  # a second call starts nothing more
    warm.wait()
    assert warm.state == "done" and warm.started_at is not None
    assert sys.modules[probe_module].THREAD == "rr-warm-import"


def test_a_message_that_needs_the_import_starts_it_and_waits(probe_module):
    # Pickled by reference to the module (imported here only to build the message, then dropped).
    box_type = __import__(probe_module).Box
    message = dumps(box_type(7))
    del sys.modules[probe_module]
    warm = WarmImport(probe_module)
    assert warm.state == "deferred"
    assert warm.loads(message).value == 7
    assert warm.state == "done"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_the_import_runs_at_the_priority_it_is_given(probe_module):
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    if base > 8:
        pytest.skip(f"this process already runs at nice {base}")
    warm = WarmImport(probe_module, priority="low")
    warm.wait()
    assert sys.modules[probe_module].NICE == 19
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base  # caller untouched
