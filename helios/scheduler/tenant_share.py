"""The tenant's 1/n share of its weight among its live classed requests (docs/scheduling-utility.md,
"Service classes and tenants": w_i = w_class(i) * W_tenant(i) / n_tenant(i)).

Only rows with class prices (RequestTable.priced) of a named tenant take part: a default-class request
of an unweighted tenant keeps weight one, so with every request in the default class nothing here runs
and every decision is the one before classes; an anonymous request (the `default` tenant, no API
`user`) is its own tenant, n = 1. n counts the tenant's live classed rows: a row joins when it is
admitted and leaves when it is done (finished or cancelled), and at each change every one of the
tenant's rows gets log w = log(w_class W) - log n.
"""

from __future__ import annotations

import math

import numpy as np


class TenantShares:
    """Live classed rows by tenant (RequestSpec.client), and the share each one's weight gets."""

    def __init__(self) -> None:
        self.rows: dict[str, set[int]] = {}
        self.tenant_of: dict[int, str] = {}  # row -> tenant, for the rows that have joined

    def join(self, t, row: int, tenant: str) -> None:
        """`row` (classed, just admitted) starts sharing `tenant`'s weight."""
        members = self.rows.setdefault(tenant, set())
        members.add(row)
        self.tenant_of[row] = tenant
        self._share(t, members)

    def leave(self, t, rows) -> None:
        """Rows that are done stop sharing (rows that never joined, or have left, are skipped)."""
        for row in rows:
            tenant = self.tenant_of.pop(int(row), None)
            if tenant is None:
                continue
            members = self.rows[tenant]
            members.discard(int(row))
            if members:
                self._share(t, members)
            else:
                del self.rows[tenant]

    @staticmethod
    def _share(t, members: set[int]) -> None:
        # w_i = (w_class W) / n: log w = log(w_class W) - log n, for each of the tenant's n rows.
        rows = np.fromiter(members, dtype=np.int64, count=len(members))
        t.log_w[rows] = t.log_w_own[rows] - math.log(len(members))
