"""The client side of the algorithms: what runs on a client worker, with torch.

One module per client method (``sgd`` in :mod:`~fedtune.algorithms.client.method`, which also
holds the :class:`~fedtune.algorithms.client.method.ClientMethod` protocol and the one local
loop), the client hooks a server rule asks for (:mod:`~fedtune.algorithms.client.hooks`,
:mod:`~fedtune.algorithms.client.fedga`, :mod:`~fedtune.algorithms.client.step_records`), the
local optimisers (:mod:`~fedtune.algorithms.client.optim`) and compute precision
(:mod:`~fedtune.algorithms.client.precision`). What the coordinator runs is in
:mod:`fedtune.algorithms.server` (NumPy only); what both read is declared in
:mod:`fedtune.algorithms.declarations` (neither torch nor NumPy).
"""

from typing import NoReturn

from fedtune.old_names import old_name_error


def __getattr__(name: str) -> NoReturn:
    """A name ``fedtune.algorithms.client`` held when it was one module raises one line naming its new home."""
    raise old_name_error(__name__, name)
