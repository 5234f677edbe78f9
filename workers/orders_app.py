"""An order desk on FastAPI and SQLAlchemy: an order and the agent turn about it are created
in one transaction (``start_turn(..., connection=session)``).

``POST /orders`` records the order and starts a turn that emails the customer a note: both
exist once the transaction commits, and the turn's message is sent only then; an order that
fails (here: its reference is taken) rolls back, and its turn with it, and nothing is sent.
``GET /orders/{reference}`` shows the order with its turn.

``POST /orders`` with ``"agent": "checkout"`` starts the ``checkout`` agent instead
(``durable_agent_examples.waiting_agents``), which waits for the event ``payment_settled``.
``POST /orders/{reference}/payments`` ``{"payment_id"}`` is the payment provider's webhook:
it marks the order paid and sends that event to its turn in one transaction
(``send_event(..., connection=session)``): the order is paid and the turn woken, or neither;
the turn is sent once the transaction has committed. The provider's retry (the same
``payment_id``) changes nothing; a payment the turn can no longer take (it ended) is refused
and leaves the order unpaid.

``POST /chat`` ``{"session_id", "message"}`` is a streaming chat endpoint: it starts a turn
and answers with server-sent events, the model's text as it is written (``token``), each
finished step (``step``), then the ``end`` with the reply. A client that loses the connection
calls ``GET /chat/{turn_id}/events`` with ``Last-Event-ID`` (the last ``id`` it got) and gets
the rest, nothing twice; one whose worker died mid-answer is sent ``abandoned`` (drop the
text of that attempt) and then the new attempt from its start.

Run it (the ``examples`` extra; Postgres and the workers as for any turn)::

    pip install 'durable-agent[examples]' uvicorn
    durable-agent migrate
    uvicorn --factory durable_agent_examples.orders_app:create_app

with ``DURABLE_AGENT_TOOLS=durable_agent_examples.email_tools`` for the workers. The app
creates its own table at start (``create_all``) to stay one file; a real application
migrates it with Alembic beside ours (docs/how-to/application-transactions.md).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field
from sqlalchemy import Engine, Text, create_engine, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from durable_agent import (
    InvalidArgument,
    TurnEnded,
    TurnEvent,
    TurnNotFound,
    get_turn,
    send_event,
    start_turn,
    stream_turn,
)
from durable_agent.settings import Settings, load_settings


class Base(DeclarativeBase):
    """The application's own tables (durable-agent's are not among them)."""


class Order(Base):
    __tablename__ = "example_orders"

    reference: Mapped[str] = mapped_column(Text, primary_key=True)
    customer_email: Mapped[str] = mapped_column(Text)
    note: Mapped[str] = mapped_column(Text)
    turn_id: Mapped[str] = mapped_column(Text, unique=True)
    payment_id: Mapped[str | None] = mapped_column(Text, default=None)


class NewOrder(BaseModel):
    reference: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_-]+$")
    customer_email: str = Field(min_length=3, max_length=200, pattern=r"^[^@\s]+@[^@\s]+$")
    note: str = Field(default="launch", min_length=1, max_length=100)
    agent: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_-]{0,63}$")


class Payment(BaseModel):
    payment_id: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_-]+$")


class PaymentTaken(BaseModel):
    reference: str
    turn_id: str
    outcome: str  # what send_event said: woke, kept, duplicate


class PlacedOrder(BaseModel):
    reference: str
    turn_id: str


class ChatMessage(BaseModel):
    session_id: str = Field(min_length=1, max_length=200)
    message: str = Field(min_length=1, max_length=10_000)


class OrderView(PlacedOrder):
    customer_email: str
    turn_status: str
    reply: str | None
    payment_id: str | None


def sqlalchemy_url(database_url: str) -> str:
    """durable-agent's database URL spelled for SQLAlchemy on psycopg 3."""
    scheme, _, rest = database_url.partition("://")
    return f"postgresql+psycopg://{rest}" if scheme in ("postgresql", "postgres") else database_url


def _session(request: Request) -> Iterator[Session]:
    with request.app.state.sessions() as session:
        yield session


DbSession = Annotated[Session, Depends(_session)]


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> FastAPI:
    """The app on durable-agent's database (the environment's settings when None)."""
    settings = settings or load_settings()
    engine = engine or create_engine(sqlalchemy_url(settings.database_url))
    Base.metadata.create_all(engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        engine.dispose()

    app = FastAPI(title="order desk", lifespan=lifespan)
    app.state.sessions = sessionmaker(engine)

    @app.post("/orders", status_code=201)
    def place_order(order: NewOrder, db: DbSession) -> PlacedOrder:
        message = f"Please email the note '{order.note}' to {order.customer_email}."
        try:
            with db.begin():  # one transaction: the turn, then the order
                turn_id = start_turn(
                    f"order-{order.reference}",
                    message,
                    agent=order.agent,
                    settings=settings,
                    connection=db,
                )
                db.add(
                    Order(
                        reference=order.reference,
                        customer_email=order.customer_email,
                        note=order.note,
                        turn_id=turn_id,
                    )
                )
        except IntegrityError:  # rolled back: no order, no turn, no message
            raise HTTPException(409, f"order {order.reference} exists") from None
        return PlacedOrder(reference=order.reference, turn_id=turn_id)

    @app.get("/orders/{reference}")
    def show_order(reference: str, db: DbSession) -> OrderView:
        found = db.scalars(select(Order).where(Order.reference == reference)).first()
        if found is None:
            raise HTTPException(404, f"no order {reference}")
        turn = get_turn(found.turn_id, settings=settings)
        return OrderView(
            reference=found.reference,
            turn_id=found.turn_id,
            customer_email=found.customer_email,
            turn_status=turn.status.value,
            reply=turn.reply,
            payment_id=found.payment_id,
        )

    @app.post("/orders/{reference}/payments")
    def take_payment(reference: str, payment: Payment, db: DbSession) -> PaymentTaken:
        with db.begin():  # one transaction: the order paid, the event sent
            order = db.get(Order, reference, with_for_update=True)
            if order is None:
                raise HTTPException(404, f"no order {reference}")
            if order.payment_id not in (None, payment.payment_id):
                raise HTTPException(409, f"order {reference} was paid by {order.payment_id}")
            order.payment_id = payment.payment_id
            try:
                sent = send_event(
                    order.turn_id,
                    "payment_settled",
                    {"payment_id": payment.payment_id, "email": order.customer_email},
                    event_id=payment.payment_id,  # the provider's retry changes nothing
                    settings=settings,
                    connection=db,
                )
            except (TurnEnded, InvalidArgument) as error:  # rolled back: the order stays unpaid
                raise HTTPException(409, str(error)) from None
        # committed: "woke" means the turn woke at this commit and is on its way
        return PaymentTaken(reference=reference, turn_id=order.turn_id, outcome=sent.outcome)

    @app.post("/chat")
    def chat(said: ChatMessage) -> Response:
        try:
            turn_id = start_turn(said.session_id, said.message, settings=settings)
        except InvalidArgument as error:
            raise HTTPException(400, str(error)) from None
        return _sse(turn_id, None, settings)

    @app.get("/chat/{turn_id}/events")
    def chat_events(
        turn_id: str, last_event_id: Annotated[str | None, Header()] = None
    ) -> Response:
        return _sse(turn_id, last_event_id, settings)

    return app


def _sse(turn_id: str, after: str | None, settings: Settings) -> Response:
    """The turn's events from ``after`` on, as server-sent events (a bad id or an unknown turn
    is refused before the stream starts; after the end, 204 tells an EventSource to stop)."""
    if after == "end":
        return Response(status_code=204)
    try:
        events = stream_turn(turn_id, tokens=True, after=after, timeout=300, settings=settings)
    except TurnNotFound as error:
        raise HTTPException(404, str(error)) from None
    except InvalidArgument as error:
        raise HTTPException(400, str(error)) from None

    def lines() -> Iterator[str]:
        yield f"event: turn\ndata: {json.dumps({'turn_id': turn_id})}\n\n"
        try:
            for event in events:
                yield _event(event)
        finally:
            events.close()

    return StreamingResponse(lines(), media_type="text/event-stream")


def _event(event: TurnEvent) -> str:
    data = json.dumps(event.as_json(), ensure_ascii=False, default=str)
    return f"id: {event.id}\nevent: {event.kind}\ndata: {data}\n\n"
