"""The megakernel pytest plugin: virtual devices, set-up errors, seeds.

Installed with the package (the ``pytest11`` entry point ``megakernel``), so
``pytest test_my_model.py`` loads it; ``-p no:megakernel`` turns it off.

Devices. The interpreter runs a kernel's cores on virtual CPU devices, whose
count jax fixes when it first runs (megakernel/virtual_devices.py). The
plugin sets ``JAX_PLATFORMS=cpu`` (unless set) before conftest.py files load,
and the count:

- ``--mk-devices N`` (or ``mk_devices = N`` in the ini file): exactly N, set
  before conftest.py files load; a test marked for more is a usage error.
- otherwise, after collection, enough for the collected tests: the largest
  ``@pytest.mark.mk_devices(n)`` among them (a file marks all its tests with
  ``pytestmark = pytest.mark.mk_devices(n)``), or more if ``XLA_FLAGS``
  already asks for more. Unmarked tests get what XLA_FLAGS asks for, else 1.

If jax started before the plugin could set the count (a conftest.py or plugin
ran a jax operation at import) and it is too small, the session stops at
once with the fix. Fixtures: ``mk_devices``, the count a module's tests are
marked with, and ``mk_mesh``, a mesh over that many devices (axis ``"x"``);
both module-scoped, as hypothesis wants of fixtures of a ``@given`` test.

Set-up errors (megakernel/testing/preflight.py) are reported as one paragraph naming
the fix, not as a counterexample. ``--mk-seed S`` seeds hypothesis for every
test, as ``megakernel check --examples N --seed S`` does, and leaves out the
example database, so a run depends on its seed alone.
"""

from __future__ import annotations

import os

import pytest

from megakernel import virtual_devices

_MODULE_DEVICES = pytest.StashKey[dict]()
_EXPLICIT = pytest.StashKey[int]()
_SOURCE = pytest.StashKey[str]()
from megakernel.chips import MAX_CORES  # noqa: E402 - jax-free: pltpu loads on a chip lookup


def _count(text) -> int:
    """An argparse/ini type: a device count in 1..MAX_CORES."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"--mk-devices / mk_devices: {text!r} is not an integer; "
                                f"give 1..{MAX_CORES}") from None
    if not 1 <= value <= MAX_CORES:
        raise pytest.UsageError(f"--mk-devices / mk_devices: {value} is out of range; "
                                f"give 1..{MAX_CORES}")
    return value


def pytest_addoption(parser):
    group = parser.getgroup("megakernel", "megakernel kernel checks")
    group.addoption("--mk-devices", default=None, metavar="N",
                    help="virtual CPU devices (TensorCores) for interpret-mode checks; "
                         "default: the largest mk_devices marker of the collected tests")
    group.addoption("--mk-seed", default=None, type=int, metavar="S",
                    help="seed hypothesis with S for every test, as `megakernel check "
                         "--seed S` does (and use no example database)")
    parser.addini("mk_devices", "virtual CPU devices, as --mk-devices", default="")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Before any conftest.py is imported: the platform, and an explicit count."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    virtual_devices.HOW_TO_ASK = ("run pytest with --mk-devices {n}, or mark the test "
                                  "@pytest.mark.mk_devices({n}) (a whole file: pytestmark = "
                                  "pytest.mark.mk_devices({n}))")
    given = early_config.known_args_namespace.mk_devices or early_config.getini("mk_devices")
    if not given:
        return
    n = _count(given)
    early_config.stash[_EXPLICIT] = n
    early_config.stash[_SOURCE] = "--mk-devices"
    if not virtual_devices.started():
        virtual_devices.configure(n)
    elif virtual_devices.available() < n:
        raise pytest.UsageError(_started_too_early(n, "--mk-devices"))


def _started_too_early(n: int, wanted_by: str) -> str:
    return (f"megakernel: {wanted_by} needs {n} virtual devices, but jax started with "
            f"{virtual_devices.available()} before the plugin could set the count (a "
            "conftest.py or plugin ran a jax operation while being imported). Set "
            f"XLA_FLAGS={virtual_devices.FLAG}={n} and JAX_PLATFORMS=cpu in the environment "
            "of pytest, or move that jax operation into a fixture or test.")


def pytest_configure(config):
    # Every op kind's rules, registered and checked complete (a kind missing a
    # rule it needs fails here, at collection, not in the one test that meets it).
    import megakernel.kinds  # noqa: F401

    config.addinivalue_line(
        "markers", "mk_devices(n): the test checks n-core kernels on n virtual CPU devices")
    seed = config.getoption("mk_seed")
    if seed is not None:
        from hypothesis import settings

        # The current profile (a conftest.py's) with no database: a seeded run
        # replays no failure saved by an earlier run.
        settings.register_profile("megakernel-seeded", parent=settings.default, database=None)
        settings.load_profile("megakernel-seeded")


def _marked(item) -> int | None:
    marker = item.get_closest_marker("mk_devices")
    if marker is None:
        return None
    if len(marker.args) != 1 or marker.kwargs:
        raise pytest.UsageError(f"{item.nodeid}: mk_devices takes one device count, e.g. "
                                f"@pytest.mark.mk_devices(2); found {marker}")
    return _count(marker.args[0])


# trylast: after -k / -m deselection, and before the collection report.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """Enough devices for the collected tests; the mesh size of each module; seeds."""
    explicit = config.stash.get(_EXPLICIT, None)
    marked = {item: n for item in items if (n := _marked(item)) is not None}
    needed = max(marked.values(), default=0)
    if explicit is not None and needed > explicit:
        over = [i.nodeid for i, n in marked.items() if n > explicit]
        raise pytest.UsageError(f"megakernel: {over[0]} (and {len(over) - 1} more) is marked "
                                f"mk_devices({needed}), but --mk-devices {explicit} was given; "
                                f"give --mk-devices {needed}, or leave it out")
    if needed:
        if virtual_devices.started():
            if virtual_devices.available() < needed:
                raise pytest.UsageError(_started_too_early(needed, "mk_devices markers"))
        elif virtual_devices.count() < needed:
            virtual_devices.configure(needed)
            config.stash[_SOURCE] = "the mk_devices markers"
    default = explicit or 1
    sizes: dict = {}
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and {"mk_mesh", "mk_devices"} & set(item.fixturenames):
            sizes.setdefault(module.__name__, {})[marked.get(item, default)] = item.nodeid
    for module, found in sizes.items():
        if len(found) > 1:
            raise pytest.UsageError(
                f"megakernel: the tests of {module} use mk_mesh / mk_devices with different "
                f"mk_devices markers ({sorted(found)}); these fixtures are shared by a "
                "module's tests, so mark the module once: pytestmark = "
                "pytest.mark.mk_devices(n), or split the file")
    config.stash[_MODULE_DEVICES] = {m: next(iter(found)) for m, found in sizes.items()}
    seed = config.getoption("mk_seed")
    if seed is not None:
        from hypothesis import seed as seeded

        for item in items:
            obj = getattr(item, "obj", None)
            if getattr(obj, "is_hypothesis_test", False):
                seeded(seed)(obj)


def pytest_report_collectionfinish(config, start_path, items):
    source = config.stash.get(_SOURCE, "XLA_FLAGS" if virtual_devices.requested() else
                              "XLA's default")
    line = (f"megakernel: {virtual_devices.count()} virtual CPU device(s) ({source}), "
            f"JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS', '')}")
    seed = config.getoption("mk_seed")
    return line + (f", hypothesis seed {seed}" if seed is not None else "")


@pytest.fixture(scope="module")
def mk_devices(request) -> int:
    """The device count the module's tests are marked with (mk_devices), else the session's
    --mk-devices, else 1."""
    known = request.config.stash.get(_MODULE_DEVICES, {})
    return known.get(request.module.__name__, request.config.stash.get(_EXPLICIT, 1))


@pytest.fixture(scope="module")
def mk_mesh(mk_devices):
    """A jax Mesh over ``mk_devices`` virtual devices, axis ``"x"``; too few devices
    is a set-up error of the module's tests, before any case is drawn."""
    from megakernel.testing import preflight
    from megakernel.backends.pallas_tpu.check.against_reference import make_mesh

    preflight.require_devices(mk_devices)
    return make_mesh(mk_devices)


# tryfirst: the outermost wrapper, so its rewrite runs after hypothesis' own.
@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """A set-up error is one paragraph: what is wrong and what to set."""
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None:
        return
    from megakernel.testing import preflight
    from megakernel.errors import SetupError

    err = call.excinfo.value
    if isinstance(err, preflight.SetupAbort):
        err = err.error
    if isinstance(err, SetupError):
        report.longrepr = f"megakernel set-up error (not a counterexample): {err}"
        # Hypothesis' "reproduce with @seed(...)" would suggest a case is at fault.
        report.sections = [s for s in report.sections if "Hypothesis" not in s[0]]
