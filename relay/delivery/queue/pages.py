"""Upper bounds of a queue file's used and free pages between two reads of the real counts
(relay.queue). Reading them is a statement (and its GIL hand-offs) per put; the bounds say when
the answer cannot matter: the pages in use cannot be over the file's page budget, the free pages
cannot have reached the count that is given back to the volume. Only then is the read skipped;
near either line the real counts are read, as before.

Only the writer connection changes the counts, under the queue's write lock. An insert adds at most
its payload's overflow pages plus PAGE_SLACK b-tree pages (a split of every level of the table and
of its index); a delete frees at most as many (deletes do not add pages in use, inserts do not add
free pages, a checkpoint moves pages without changing either count). Counts read inside a
transaction that then fails are forgotten (relay.queue starts new bounds): the next put reads them."""

from __future__ import annotations

from relay.delivery.queue.files import PAGE_SIZE

PAGE_SLACK = 14
_OVERFLOW = PAGE_SIZE - 4  # payload bytes an overflow page holds


def row_pages(nbytes: int) -> int:
    """Pages one row of ``nbytes`` payload can add (or free), at most."""
    return -(-nbytes // _OVERFLOW) + PAGE_SLACK


class PageBounds:
    def __init__(self) -> None:
        self.used: int | None = None  # None: not read yet
        self.free: int | None = None

    def read(self, pages: int, free: int) -> None:
        """The real counts (pragma_page_count, pragma_freelist_count) as just read."""
        self.used, self.free = pages - free, free

    def set_free(self, free: int) -> None:
        self.free = free

    def inserted(self, nbytes: int, rows: int) -> None:
        """Rows of ``nbytes`` stored payload in all were inserted."""
        if self.used is not None:
            self.used += nbytes // _OVERFLOW + rows * (1 + PAGE_SLACK)

    def deleted(self, nbytes: int, rows: int) -> None:
        """Rows of at most ``nbytes`` payload in all were deleted."""
        if self.free is not None:
            self.free += nbytes // _OVERFLOW + rows * (1 + PAGE_SLACK)

    def fits(self, db_pages: int) -> bool:
        """The pages in use cannot be over ``db_pages``."""
        return self.used is not None and self.used <= db_pages

    def free_below(self, pages: int) -> bool:
        """The free pages cannot have reached ``pages``."""
        return self.free is not None and self.free < pages
