"""``edge-agent web``: the local web page for the farmer and the expert.

A separate process from the daemon: it reads the state directory the daemon and trainer write (SQLite in
WAL mode, status files, the engine store) and never holds a lock the daemon waits on, so a crash or a
slow page cannot touch classification. Server-rendered pages, every asset in the package, no CDN.

    edge-agent web --state-dir S                 # http://127.0.0.1:8080, this machine only
    edge-agent web --state-dir S --new-token     # print a token (stored hashed) for other machines
    edge-agent web --state-dir S --new-token --role read   # one that can see but change nothing (a dashboard)
    edge-agent web --state-dir S --bind 0.0.0.0  # the farm's network; every request needs the token
"""

from __future__ import annotations

from pathlib import Path

from engines.errors import EdgeAgentError

__all__ = ["serve", "new_token", "WebError"]


class WebError(EdgeAgentError, RuntimeError):
    """The page cannot start as asked (an open address without a token)."""


def _tokens(state_dir: Path):
    from edge_agent.web.auth import Tokens

    return Tokens(state_dir / "web")


def new_token(state_dir: Path, role: str = "admin") -> str:
    """A new access token with ``role`` (read, label, admin) for ``state_dir``'s page and API (that role's previous
    one stops working)."""
    return _tokens(state_dir).new(role)


def serve(cfg, state_dir: Path) -> int:
    """Serve the page on ``[web] bind`` and ``port`` (the command line's --bind and --port set them) until SIGTERM/SIGINT."""
    import uvicorn

    from edge_agent.log import get_logger
    from edge_agent.state import StateLayout, inbox_dir
    from edge_agent.web.app import WebContext, create_app
    from edge_agent.web.auth import is_local_bind

    bind, port = cfg.web.bind, cfg.web.port
    if not is_local_bind(bind) and not _tokens(state_dir).exists():
        raise WebError(
            f"--bind {bind} opens the page to other machines: first run `edge-agent web --state-dir {state_dir} "
            "--new-token` and keep the link it prints"
        )
    app = create_app(WebContext(cfg, StateLayout(state_dir), inbox_dir(cfg, state_dir), bind))
    host = f"[{bind}]" if ":" in bind else bind
    get_logger("web", state_dir=str(state_dir)).info("web_listening", url=f"http://{host}:{port}/", token_required=not is_local_bind(bind))
    from edge_agent.web._limits import guarded_protocol, raise_file_limit

    log = get_logger("web", state_dir=str(state_dir))
    raise_file_limit(cfg.web.max_connections + 256)  # the connections, and room for the database and photos
    config = uvicorn.Config(
        app,
        host=bind,
        port=port,
        lifespan="off",
        ws="none",
        loop="asyncio",
        http=guarded_protocol(cfg.web.max_connections, cfg.web.idle_timeout_s, log),
        timeout_keep_alive=5,
        backlog=128,
        h11_max_incomplete_event_size=16 * 1024,
        log_config=None,
        access_log=False,
        server_header=False,
        log_level="warning",
    )
    _server_class()(config).run()
    get_logger("web", state_dir=str(state_dir)).info("web_stopped")
    return 0


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, but SIGTERM/SIGINT end it with status 0 (uvicorn re-raises the signal after
        shutting down), as the daemon and the trainer do."""

        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            self._captured_signals.clear()

    return Server
