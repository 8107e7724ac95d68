"""The virtual CPU devices interpret-mode checks run on: how many, and when that is fixed.

The Pallas interpreter runs each TensorCore of a kernel on one CPU device. XLA
makes N of them when ``XLA_FLAGS`` holds ``--xla_force_host_platform_device_count=N``
(or jax's ``jax_num_cpu_devices`` option is N) at the moment jax starts its
backends: the first ``jax.devices()`` or the first jax operation of the process,
not ``import jax``. From then on the count is fixed until the process exits, so
everything here either acts before that moment or says so.
"""

from __future__ import annotations

import os
import re
import sys

FLAG = "--xla_force_host_platform_device_count"
_COUNT = re.compile(re.escape(FLAG) + r"=(\S*)")

# What a user sets to get more devices. The pytest plugin replaces it with its
# own options while it runs (megakernel/testing/pytest_plugin.py).
HOW_TO_ASK = (f"set XLA_FLAGS={FLAG}={{n}} and JAX_PLATFORMS=cpu in the environment "
              "before the process starts")


def how_to_ask(n: int) -> str:
    """The fix for a shortage, naming ``n``."""
    return HOW_TO_ASK.format(n=n)


def requested(environ=os.environ) -> int | None:
    """The device count ``XLA_FLAGS`` asks for, or None when it names none.

    The last occurrence counts, as in XLA's own flag parser."""
    found = _COUNT.findall(environ.get("XLA_FLAGS", ""))
    if not found:
        return None
    try:
        return int(found[-1])
    except ValueError:
        return None


def started() -> bool:
    """Whether jax has started its backends, fixing the device count."""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())


def available() -> int:
    """Devices of jax's default backend (starts the backends if they are not yet)."""
    import jax

    return len(jax.devices())


def configure(n: int, *, environ=os.environ) -> None:
    """Ask for ``n`` virtual CPU devices and the CPU platform, before jax starts.

    The count goes into ``XLA_FLAGS`` (other flags kept), where child processes
    see it too; a user's own ``JAX_PLATFORMS`` is kept. When jax is already
    imported, its options are set as well: jax reads ``JAX_PLATFORMS`` at
    import, and ``jax_num_cpu_devices`` overrides the flag when someone set it."""
    if started():
        raise RuntimeError("jax's backends have started; the device count is fixed")
    flags = _COUNT.sub("", environ.get("XLA_FLAGS", "")).split()
    environ["XLA_FLAGS"] = " ".join(flags + [f"{FLAG}={n}"])
    environ.setdefault("JAX_PLATFORMS", "cpu")
    if "jax" in sys.modules:
        import jax

        if not jax.config.jax_platforms:
            jax.config.update("jax_platforms", environ["JAX_PLATFORMS"])
        if jax.config.jax_num_cpu_devices >= 0:
            jax.config.update("jax_num_cpu_devices", n)


def count() -> int:
    """The devices a check will find: the started backend's, else what is asked for
    (``jax_num_cpu_devices`` over ``XLA_FLAGS``), else XLA's default of 1."""
    if started():
        return available()
    if "jax" in sys.modules:
        import jax

        if jax.config.jax_num_cpu_devices >= 0:
            return int(jax.config.jax_num_cpu_devices)
    return requested() or 1
