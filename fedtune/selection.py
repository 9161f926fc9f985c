"""Alias of :mod:`fedtune.results.selection`, where the model-selection protocol lives.

``import fedtune.selection`` gives that very module object (kept so older imports work).
"""

import sys

from fedtune.results import selection as _selection

sys.modules[__name__] = _selection
