"""Priority tiers: their order and their number on each broker, in one place."""

from __future__ import annotations

import enum

# Redis: `queue_order_strategy=priority` keeps one list per step and pops the lowest step first.
REDIS_PRIORITY_STEPS = [0, 3, 6, 9]
# RabbitMQ: queues are declared with x-max-priority; a higher number is delivered first.
AMQP_MAX_PRIORITY = 9


class Priority(str, enum.Enum):
    """A job's tier. It compares equal to its name ("high" == Priority.HIGH), so rows and
    messages keep the plain string."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def rank(self) -> int:
        """0 first: the order in which waiting jobs are taken."""
        return _ORDER.index(self)

    @property
    def redis_step(self) -> int:
        return REDIS_PRIORITY_STEPS[self.rank]

    @property
    def amqp_number(self) -> int:
        return (9, 5, 1)[self.rank]

    def broker_number(self, redis: bool) -> int:
        return self.redis_step if redis else self.amqp_number

    @classmethod
    def parse(cls, value: object) -> Priority:
        """The tier named `value`, or ValueError saying which names there are."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"priority {value!r} is not one of: {', '.join(PRIORITIES)}") from None

    @classmethod
    def rank_of(cls, value: str | None, default: Priority | None = None) -> int:
        """The rank of a tier's name; an unknown name ranks as `default` (NORMAL)."""
        try:
            return cls(value).rank
        except ValueError:
            return (default or cls.NORMAL).rank


_ORDER = (Priority.HIGH, Priority.NORMAL, Priority.LOW)
PRIORITIES = tuple(p.value for p in _ORDER)
