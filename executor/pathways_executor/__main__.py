"""``python -m pathways_executor``: one executor process owning this host's devices."""

from __future__ import annotations

import argparse
import os

from pathways_core.flags import at_least, port

COMPILATION_CACHE_BYTES = 4 << 30


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: a wrong number is named with what it must be."""
    parser = argparse.ArgumentParser(prog="pathways_executor", description=__doc__)
    parser.add_argument(
        "--index", type=at_least(0), default=0, help="executor (host) index in the island"
    )
    parser.add_argument(
        "--first-device",
        type=at_least(0),
        default=0,
        help="island device id of this host's first device",
    )
    parser.add_argument(
        "--fake-devices",
        type=at_least(0),
        default=0,
        help="run on N fake CPU devices instead of the host's accelerators (0: the host's)",
    )
    parser.add_argument(
        "--hosts",
        type=at_least(1),
        default=1,
        help="executors in the island (one JAX distributed group)",
    )
    parser.add_argument(
        "--coordinator", default="", help="host:port of the island's JAX coordinator (executor 0)"
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=at_least(1),
        default=100,
        help="seconds after which the group gives up on a silent executor",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port, default=0, help="0 picks a free port")
    parser.add_argument(
        "--health-port",
        type=port,
        default=None,
        help="serve the liveness endpoint GET /healthz and the metrics GET /metrics on this "
        "port (0 picks a free one; unset: none)",
    )
    parser.add_argument(
        "--compilation-cache",
        default=os.path.expanduser("~/.cache/pathways/xla"),
        help="persistent XLA compilation cache folder ('' to disable)",
    )
    parser.add_argument(
        "--exit-with-launcher",
        action="store_true",
        help="stop when standard input closes (a local launcher holds its other end)",
    )
    args = parser.parse_args(argv)
    problem = _argument_problem(args)
    if problem:
        parser.error(problem)
    return args


def _argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags together, if anything (each alone is checked by its type)."""
    if args.hosts > 1:  # the executor joins a JAX group of --hosts processes as --index
        if args.index >= args.hosts:
            return f"--index must be below --hosts ({args.hosts}), not {args.index}"
        if not args.coordinator and args.fake_devices:  # (on TPU hosts JAX may find it)
            return "--hosts > 1 needs --coordinator (host:port of executor 0's JAX coordinator)"
    return None


def configure(args: argparse.Namespace) -> None:
    """Settings that must be made before JAX is first imported."""
    if args.fake_devices:
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_force_host_platform_device_count={args.fake_devices}".strip()
        )
        os.environ.setdefault("JAX_PLATFORMS", "cpu")


if __name__ == "__main__":
    arguments = parse()
    configure(arguments)
    if arguments.exit_with_launcher:  # first: joining a group whose coordinator died hangs
        from pathways_executor.lifeline import stop_when_stdin_closes

        stop_when_stdin_closes()
    if arguments.health_port is not None:  # first: answers while JAX starts and joins its group
        from pathways_executor.health import serve_health

        arguments.health_port = serve_health(arguments.host, arguments.health_port)
    if arguments.fake_devices:  # buffers of CPU devices are host memory
        from pathways_executor.memory import keep_freed_memory

        keep_freed_memory()
    import jax

    # Arrays keep the dtypes clients send: without it a float64 or int64 input was narrowed
    # to 32 bits when placed, failing the computation exported for 64 (and, spanning hosts,
    # crashing the runtime). Functions carry their dtypes; this changes no other.
    jax.config.update("jax_enable_x64", True)
    if arguments.hosts > 1:
        # The executors of a multi-host island form one JAX distributed group, so one SPMD
        # function can span hosts with collectives (gloo on CPU).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            arguments.coordinator,
            num_processes=arguments.hosts,
            process_id=arguments.index,
            heartbeat_timeout_seconds=arguments.heartbeat_timeout,
        )
    if arguments.compilation_cache:
        jax.config.update("jax_compilation_cache_dir", arguments.compilation_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        # The executors of an island (and islands on one host) share the directory. With a
        # size bound JAX's cache holds a file lock around reads and writes; without one, a
        # reader may load another process's half-written entry.
        jax.config.update("jax_compilation_cache_max_size", COMPILATION_CACHE_BYTES)
    from pathways_executor.server import main

    main(arguments)
