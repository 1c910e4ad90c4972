"""What every route of one replica's server shares: its engine, backend, admin token and
the tokenizer threads (built by ``app.create_app``, read by the routes)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from slopilot.engine.server.admin_credential import AdminCredential
from slopilot.engine.server.async_engine import AsyncEngine
from slopilot.engine.server.backends import Backend
from slopilot.engine.server.client_gate import ClientGrants
from slopilot.engine.server.logprobs_format import TokenText


@dataclass
class ServerState:
    engine: AsyncEngine
    backend: Backend
    admin_token: AdminCredential | None
    drain_timeout_s: float
    tokenizer_threads: int
    text_of: TokenText
    # When the server started, in Unix seconds: its model card's ``created``.
    started_at: int = 0
    # Tokenizing and chat templates run here, never on the event loop; started and
    # stopped with the app.
    tokenize: ThreadPoolExecutor | None = field(default=None)
    # The classes each client may name (--clients); None: any, as in vLLM.
    clients: ClientGrants | None = None
