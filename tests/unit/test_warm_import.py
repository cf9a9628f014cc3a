"""The checkpoint writers' deferred import of DCP (`WarmImport`): nothing is imported until the
run asks for it or a message needs it, and the import runs on the thread made with it."""

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
    """A module that records, when imported, which thread imports it."""
    name = f"rr_warm_probe_{os.getpid()}_{threading.get_ident()}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        import os, threading
        TID = threading.get_native_id()
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


def test_the_import_runs_on_the_thread_created_with_it(probe_module):
    """A writer lowers every thread but this one (`thread_id`, known before `start`): the import
    must run there, at the ranks' priority, whoever calls `start`."""
    warm = WarmImport(probe_module)
    known = warm.thread_id
    assert known is not None
    starter = threading.Thread(target=warm.start)
    starter.start()
    starter.join()
    warm.wait()
    imported_on = sys.modules[probe_module].TID
    assert imported_on == known
