"""Celery tasks of the orders app (an ``OjsTask`` each, through ``task_cls``)."""

from celery import shared_task

from ojs_adapters import JobError

#: What the test makes the payment gateway answer, call after call.
GATEWAY_ANSWERS: list[str] = []


@shared_task(retry_policy={"non_retryable_errors": ["payment.card_stolen"]})
def charge(order_id: int) -> str:
    answer = GATEWAY_ANSWERS.pop(0) if GATEWAY_ANSWERS else "ok"
    if answer != "ok":
        raise JobError(f"payment.{answer}", f"order {order_id}: {answer}")
    return f"order {order_id} charged"
