"""The daemon's gRPC server: ``grpc.aio`` on one event-loop thread.

Agents of protocol v2 each hold one long-lived stream; on the asyncio server a stream is a
coroutine, not a thread, so a thousand agents cost a thousand small tasks. The unary services
(ClientService, the v1 agent service that answers old agents, health) keep their plain
synchronous servicers, run on a thread pool as the threaded server did: :class:`SyncHandlers`
turns each into a coroutine that runs it there, with a context that has the synchronous API
(``is_active`` turns false when the client goes, so a long poll ends with it). The daemon's
interceptors are synchronous too; :class:`SyncInterceptor` runs them here.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from concurrent import futures
from typing import Any, Awaitable, Callable, Sequence, TypeVar

import grpc

T = TypeVar("T")


class SyncInterceptor(grpc.aio.ServerInterceptor):
    """A ``grpc.ServerInterceptor`` on the asyncio server: the handler is looked up first, then
    given to the synchronous interceptor as what its continuation returns."""

    def __init__(self, interceptor: grpc.ServerInterceptor) -> None:
        self.interceptor = interceptor

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        return self.interceptor.intercept_service(lambda _details: handler, handler_call_details)


class _SyncContext:
    """The synchronous ``grpc.ServicerContext`` API over an asyncio call's context, for a handler
    running on a worker thread."""

    def __init__(self, context: grpc.aio.ServicerContext, loop: asyncio.AbstractEventLoop) -> None:
        self._context = context
        self._loop = loop
        self._ended = threading.Event()
        self._callbacks: list[Callable[[], None]] = []

    def end(self) -> None:
        """The call is over (answered, or the client went): callbacks run, ``is_active`` is false."""
        if not self._ended.is_set():
            self._ended.set()
            for callback in self._callbacks:
                callback()

    def is_active(self) -> bool:
        return not self._ended.is_set()

    def add_callback(self, callback: Callable[[], None]) -> bool:
        self._callbacks.append(callback)
        return True

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        # the asyncio context records the status and raises AbortError, here in the worker thread:
        # it unwinds the handler and, re-raised by the coroutine, ends the call with that status
        asyncio.run_coroutine_threadsafe(self._context.abort(code, details), self._loop).result()

    def peer(self) -> str:
        return self._context.peer()

    def invocation_metadata(self):
        return self._context.invocation_metadata()

    def set_trailing_metadata(self, metadata) -> None:
        self._context.set_trailing_metadata(metadata)

    def set_code(self, code: grpc.StatusCode) -> None:
        self._context.set_code(code)

    def set_details(self, details: str) -> None:
        self._context.set_details(details)

    def time_remaining(self):
        return self._context.time_remaining()

    def auth_context(self):
        return self._context.auth_context()


_DONE = object()


class SyncHandlers(grpc.aio.ServerInterceptor):
    """Runs synchronous handlers on ``pool`` as coroutines (the outermost interceptor, so it sees
    handlers as the synchronous interceptors left them). A request stream is not read: the only
    synchronous handlers of streamed requests are refusals."""

    def __init__(self, pool: futures.ThreadPoolExecutor) -> None:
        self.pool = pool

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        behaviour = (handler.unary_unary or handler.unary_stream or handler.stream_unary
                     or handler.stream_stream)
        if inspect.iscoroutinefunction(behaviour) or inspect.isasyncgenfunction(behaviour):
            return handler
        pool = self.pool

        def unread(request):
            return iter(()) if handler.request_streaming else request

        if not handler.response_streaming:
            async def unary(request, context):
                loop = asyncio.get_running_loop()
                sync_context = _SyncContext(context, loop)
                try:
                    return await loop.run_in_executor(pool, behaviour, unread(request), sync_context)
                finally:
                    sync_context.end()

            make = grpc.stream_unary_rpc_method_handler if handler.request_streaming else \
                grpc.unary_unary_rpc_method_handler
            return make(unary, handler.request_deserializer, handler.response_serializer)

        async def streaming(request, context):
            loop = asyncio.get_running_loop()
            sync_context = _SyncContext(context, loop)
            try:
                responses = await loop.run_in_executor(pool, lambda: iter(behaviour(unread(request), sync_context)))
                while (response := await loop.run_in_executor(pool, next, responses, _DONE)) is not _DONE:
                    yield response
            finally:
                sync_context.end()

        make = grpc.stream_stream_rpc_method_handler if handler.request_streaming else \
            grpc.unary_stream_rpc_method_handler
        return make(streaming, handler.request_deserializer, handler.response_serializer)


class LoopServer:
    """A ``grpc.aio`` server running on its own event-loop thread, driven from synchronous code.

    ``setup(server)`` adds servicers and ports (on the loop) and returns what the caller wants back
    (the port). Synchronous handlers run on ``max_workers`` threads.
    """

    def __init__(self, interceptors: Sequence[grpc.ServerInterceptor], options: Sequence[tuple[str, Any]],
                 max_workers: int, setup: Callable[[grpc.aio.Server], T]) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tunefleet-grpc-loop", daemon=True)
        self._thread.start()
        self._pool = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="tunefleet-rpc")
        self._stopped = threading.Event()

        async def create() -> tuple[grpc.aio.Server, T]:
            server = grpc.aio.server(migration_thread_pool=self._pool, options=list(options),
                                     interceptors=[SyncHandlers(self._pool)]
                                     + [SyncInterceptor(i) for i in interceptors])
            return server, setup(server)

        try:
            self._server, self.setup_result = self.run(create())
        except BaseException:
            self._close_loop()
            raise

    def run(self, coroutine: Awaitable[T], timeout_s: float | None = None) -> T:
        """Run ``coroutine`` on the server's loop and wait for its result (from any other thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def start(self) -> None:
        self.run(self._server.start())

    def stop(self, grace_s: float | None) -> threading.Event:
        """Stop taking calls, give those in progress ``grace_s``, then end; the returned event is set
        (as the threaded server's ``stop`` returns one)."""
        if not self._stopped.is_set():
            try:
                self.run(self._server.stop(grace_s))
            finally:
                self._close_loop()
                self._stopped.set()
        return self._stopped

    def wait_for_termination(self, timeout_s: float | None = None) -> bool:
        return self._stopped.wait(timeout_s)

    def _close_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self._pool.shutdown(wait=False, cancel_futures=True)
