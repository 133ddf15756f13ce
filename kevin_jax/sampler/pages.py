"""Host-side page bookkeeping: free list, reference counts, and the prefix cache that lets sequences share pages.

A full page of prompt tokens is identified by a chained hash of every token up to its end (blake2b of the previous
page's digest and this page's ids), so two sequences share a page exactly when their prompts agree up to that page's
end: the trajectories of one task share their whole first-turn prompt, later turns share the task preamble.
Unreferenced pages that hold a hashed prefix stay cached (LRU) until their memory is needed.
"""
from __future__ import annotations

import collections
import hashlib
from collections.abc import Sequence

import numpy as np


class OutOfPages(RuntimeError):
    """The KV pool has no free page left."""


def prefix_hashes(tokens: Sequence[int], page_size: int, num_pages: int) -> list[bytes]:
    """Chained digests of the first `num_pages` full pages of `tokens`."""
    ids = np.asarray(tokens, np.int32)
    digests, previous = [], b""
    for i in range(num_pages):
        previous = hashlib.blake2b(previous + ids[i * page_size:(i + 1) * page_size].tobytes(),
                                   digest_size=16).digest()
        digests.append(previous)
    return digests


class PageAllocator:
    """Pages 1..num_pages-1 of each layer (page 0 is scratch). Not thread-safe (one scheduler owns it)."""

    def __init__(self, num_pages: int, page_size: int, prefix_sharing: bool = True):
        if num_pages < 2:
            raise ValueError(f"need at least 2 pages (one is scratch), got {num_pages}")
        self.num_pages = num_pages
        self.page_size = page_size
        self.prefix_sharing = prefix_sharing
        self._free = list(range(num_pages - 1, 0, -1))            # a stack: low page ids first
        self._refs = np.zeros(num_pages, np.int32)
        self._page_of_hash: dict[bytes, int] = {}
        self._hash_of_page: dict[int, bytes] = {}
        self._evictable: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._ready_phase: dict[int, int] = {}                    # pages registered this admission round

    # ------------------------------------------------------------------ counts
    @property
    def available(self) -> int:
        """Pages that an allocation can get now (free, or cached but unreferenced)."""
        return len(self._free) + len(self._evictable)

    @property
    def in_use(self) -> int:
        return int(np.count_nonzero(self._refs))

    def refcount(self, page: int) -> int:
        return int(self._refs[page])

    # ------------------------------------------------------------------ plain pages
    def allocate(self, count: int = 1) -> list[int]:
        if count > self.available:
            raise OutOfPages(f"need {count} KV pages, {self.available} available of {self.num_pages - 1}")
        pages = []
        for _ in range(count):
            if self._free:
                page = self._free.pop()
            else:
                page, _ = self._evictable.popitem(last=False)      # least recently released cached prefix
                del self._page_of_hash[self._hash_of_page.pop(page)]
            self._refs[page] = 1
            pages.append(page)
        return pages

    def release(self, pages: Sequence[int]) -> None:
        for page in pages:
            if self._refs[page] <= 0:
                raise RuntimeError(f"page {page} released more often than it was taken")
            self._refs[page] -= 1
            if self._refs[page] == 0:
                if page in self._hash_of_page:
                    self._evictable[page] = None
                else:
                    self._free.append(page)

    # ------------------------------------------------------------------ prefix cache
    def start_round(self) -> None:
        """Pages registered before this call are computed (their prefill was issued earlier)."""
        self._ready_phase.clear()

    def lookup(self, digests: Sequence[bytes]) -> list[int]:
        """Pages of the longest cached prefix of `digests` (no references taken)."""
        if not self.prefix_sharing:
            return []
        pages = []
        for digest in digests:
            page = self._page_of_hash.get(digest)
            if page is None:
                break
            pages.append(page)
        return pages

    def cost(self, matched: Sequence[int], new_pages: int) -> int:
        """How much `available` drops if `matched` are shared and `new_pages` allocated."""
        return new_pages + sum(1 for p in matched if self._refs[p] == 0)

    def share(self, pages: Sequence[int]) -> None:
        for page in pages:
            if self._refs[page] == 0:
                self._evictable.pop(page, None)
            self._refs[page] += 1

    def register(self, page: int, digest: bytes, phase: int) -> None:
        """Marks `page` as holding the prefix `digest`; its KV is written by prefill phase `phase` of this round."""
        if not self.prefix_sharing or digest in self._page_of_hash:
            return
        self._page_of_hash[digest] = page
        self._hash_of_page[page] = digest
        self._ready_phase[page] = phase

    def ready_phase(self, page: int) -> int:
        """0 when the page's KV was written before this round, else the prefill phase that writes it."""
        return self._ready_phase.get(page, 0)
