"""The server side of the algorithms: what the coordinator runs, NumPy only (no torch).

The :class:`~fedtune.algorithms.server.rule.ServerRule` protocol and FedAvg
(:mod:`~fedtune.algorithms.server.rule`), the aggregation math they share
(:mod:`~fedtune.algorithms.server.aggregate`, the blocked passes of
:mod:`~fedtune.algorithms.server.blocked`), one module per server rule (FedDA/FedGP, FedGaLA,
FedOMG, FedGA), the server optimisers (:mod:`~fedtune.algorithms.server.optimizer`) and the
server sides of client methods (:mod:`~fedtune.algorithms.server.side`; SCAFFOLD's control
variate, FedDyn's ``h``, FedIIR's and Fishr's running means, FedGaLA's last global move). What a
client worker runs is in :mod:`fedtune.algorithms.client` (torch).
"""

from typing import NoReturn

from fedtune.old_names import old_name_error


def __getattr__(name: str) -> NoReturn:
    """A name ``fedtune.algorithms.server`` held when it was one module raises one line naming its new home."""
    raise old_name_error(__name__, name)
