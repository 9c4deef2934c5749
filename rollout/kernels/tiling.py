"""Launch settings shared by the Triton kernels and the host code that builds their launch metadata.

No torch here: the host-only scheduling part reads it.
"""

from dataclasses import dataclass

# The Triton kernels' tiles (decode 32 or 128 tokens, extend 64) hold whole pages or lie within
# one: pages of a power of two up to the widest tile can hold V by token.
V_BY_TOKEN_MAX_PAGE = 128


def lays_out_v_by_token(block_size: int) -> bool:
    """Whether an FP8 cache of pages of `block_size` tokens holds V by token
    (`torch_paged_attention.v_by_token`)."""
    return 0 < block_size <= V_BY_TOKEN_MAX_PAGE and block_size & (block_size - 1) == 0


def tile_fits_pages(tile: int, page: int) -> bool:
    """Whether a `tile`-token KV tile holds whole pages of `page` tokens or lies within one."""
    return tile % page == 0 or page % tile == 0


def page_run(page: int, tile: int, by_token: bool, kernel: str) -> int:
    """Tokens of a `tile`-token KV tile that lie side by side on one page of `page` tokens: a
    tile holds whole pages or lies within one (both powers of two), which V laid out by token
    needs (`triton_attention_tiles.load_kv_tile`); refused otherwise, before a launch."""
    if by_token and not tile_fits_pages(tile, page):
        raise ValueError(
            f"{kernel}: tiles of {tile} tokens over pages of {page} with V laid out by token; "
            "a tile must hold whole pages or lie within one (DecodeTiles.block_n, block_size)"
        )
    return min(page, tile)


EXTEND_BLOCK_M = 64
"""Query rows per prefill/extend program: the host splits each sequence's chunk into q-blocks."""

W8A8_MAX_ROWS = 128
"""The most rows a GEMM over FP8 activations and weights runs on the FP8-MMA kernel
(`triton_w8a8_linear.w8a8_linear`); at more (prefill) F.linear over the rounded rows serves."""


@dataclass(frozen=True)
class DecodeTiles:
    """Launch shape of the decode kernel. Pieces of up to 512 tokens in 128-token KV tiles won
    `bench_attention.py --sweep` at large batches; aiming at 256 programs won
    `bench_attention.py --regimes` from one sequence to 128 (more programs cut long contexts
    into more pieces than the merge can afford); once the batch alone fills the target, pieces
    of up to 1,024 tokens won there from 32 sequences up (and lost where a piece is wanted
    anyway: 4-16 long sequences). See docs/performance.md, 'Decode attention alone' (and 'FP8 KV:
    the merge's registers' for `merge_pairs`)."""

    split_len: int = 512  # the longest piece while a launch wants several a sequence
    block_n: int = 128  # tokens per inner iteration, also the shortest piece
    num_warps: int = 4
    num_stages: int = 3
    target_programs: int = 256  # programs a launch aims at; 0: every piece is split_len long
    full_batch_split_len: int = 1024  # the longest piece once a launch has one piece a sequence
    fp8_full_batch_split_len: int = 2048  # the same over an FP8 cache (half the bytes a token)
    # Over an FP8 cache, where a launch aims at this many pieces a (sequence, KV head) or more
    # (at most 4 sequences of 8 KV heads), pieces of up to fp8_full_batch_split_len: 512-token
    # pieces made 2-3 times the programs wanted there, and their merge cost more than it gave
    # (docs/performance.md, 'Longer pieces in the tail, again'); 0 keeps split_len.
    fp8_few_sequences_min_splits: int = 8
    # (row, piece) pairs one merge load holds ([rows, pieces, head_dim] fp32). The merge shares
    # the kernel's registers with the tile loop: 64 took an FP8 launch to a register count that
    # fits one program fewer per SM.
    merge_pairs: int = 32
    # An FP8 cache's tiles with the keys on the MMA's wide side (`fold_tile_keys_wide`) where a
    # launch has at most KEYS_WIDE_MAX_ROWS query rows a KV head; 0 puts the query rows there,
    # padded to 16, as a bf16 cache's tiles and launches with more rows do.
    fp8_keys_wide: bool = True
    # A cap on the registers a thread (Triton's maxnreg), so that more programs share an SM: 0
    # leaves the count to the compiler (benchmarks compare caps; past the cap, values spill).
    max_registers: int = 0
    # Over an FP8 cache, once the batch alone fills the launch (one piece a (sequence, KV head))
    # and the keys-wide tiles serve it: tiles of this many tokens in programs of this many
    # warps. In grpo on one H200 they took 2-7% off the steps at 32-47 and 64-128 running and
    # added 4% at 48-63 ('FP8: one-warp programs for crowded launches' in docs/performance.md;
    # at equal contexts, 32-64 sequences lost); 0 keeps block_n and num_warps.
    fp8_full_batch_block_n: int = 32
    fp8_full_batch_num_warps: int = 1
    # Where those one-warp tiles start, in (sequence, KV head) pairs a launch, and how many
    # programs such a launch aims at (several pieces a pair below it, each of up to
    # fp8_full_batch_split_len tokens). 0 takes target_programs for either: from the batch that
    # fills the launch alone, one piece a pair. For benchmarks: one-warp launches of more,
    # shorter pieces where four-warp ones leave the SMs few warps.
    fp8_one_warp_min_pairs: int = 0
    fp8_one_warp_target_programs: int = 0
    # A cap on the one-warp launches' registers a thread (Triton's maxnreg; 0: max_registers').
    # Triton 3.6 compiles them to 187 registers for the H100 (8 programs an SM), Triton 3.9 to
    # 151-159 (12); capped at 128, 16 share an SM and read 13-14% slower at 64-128 equal
    # contexts (docs/performance.md, 'FP8 KV: more one-warp programs an SM', run with 3.6,
    # where the cap may spill). For benchmarks.
    fp8_one_warp_max_registers: int = 0
    # Software-pipeline stages of the one-warp launches (0: num_stages'). Triton gives the
    # block table's load a stage of its own, so 3 or 4 stages keep one K/V buffer: a tile's
    # copies are issued as the tile before it ends and waited for as it starts. 5 keep two
    # (18 KB of shared memory a program), 7 three (27 KB). Two buffers read 1-7% slower at
    # equal contexts of 32-128 sequences and made grpo's steps at 32-111 running 1-5% slower
    # on one H100 ('FP8 KV: the copies' wait, profiled' in docs/performance.md). For benchmarks.
    fp8_one_warp_num_stages: int = 0
    # The one-warp launches' merge_pairs (0: merge_pairs'). A merge load of 32 pairs holds 128
    # fp32 values a thread in one warp (32 in four): compiled for the H100 by Triton 3.6 that
    # takes the whole kernel to 187 registers, 8 programs an SM; 16 pairs, 149 (12 an SM), yet
    # read up to 12% slower at a grpo run's batches, the more so aiming at 2,048 programs
    # ('FP8 KV: K head by head' in docs/performance.md). For benchmarks.
    fp8_one_warp_merge_pairs: int = 0

    def __post_init__(self) -> None:
        if self.merge_pairs < 1 or self.merge_pairs & (self.merge_pairs - 1):
            raise ValueError(
                f"DecodeTiles.merge_pairs must be a power of two; got {self.merge_pairs}"
            )
        pairs = self.fp8_one_warp_merge_pairs
        if pairs < 0 or pairs & (pairs - 1):
            raise ValueError(
                f"DecodeTiles.fp8_one_warp_merge_pairs must be 0 or a power of two; got {pairs}"
            )

    def merge_load_pairs(self, one_warp: bool) -> int:
        """(row, piece) pairs one merge load of a launch holds (`one_warp_tiles`)."""
        if one_warp and self.fp8_one_warp_merge_pairs:
            return self.fp8_one_warp_merge_pairs
        return self.merge_pairs

    def splits_per_sequence(
        self, num_seqs: int, num_kv_heads: int, target: int | None = None
    ) -> int:
        """How many pieces each (sequence, KV head) aims at for a batch of `num_seqs`, in a
        launch that aims at `target` programs (target_programs where None; 0: one)."""
        target = self.target_programs if target is None else target
        if not target:
            return 1
        return max(1, -(-target // (max(num_seqs, 1) * num_kv_heads)))

    def longest_piece(self, splits_wanted: int, fp8_kv: bool = False) -> int:
        """The longest piece one program reads, given the pieces each sequence aims at."""
        full_batch = self.fp8_full_batch_split_len if fp8_kv else self.full_batch_split_len
        if self.target_programs and splits_wanted == 1 and full_batch:
            return full_batch
        few = self.fp8_few_sequences_min_splits
        if fp8_kv and self.target_programs and few and splits_wanted >= few:
            return max(self.split_len, self.fp8_full_batch_split_len)
        return self.split_len

    def one_warp_tiles(self, pairs: int, fp8_kv: bool, keys_wide: bool, page: int) -> bool:
        """Whether a launch over `pairs` (sequence, KV head) pairs takes the FP8 full-batch tiles
        (`fp8_full_batch_block_n` tokens, `fp8_full_batch_num_warps` warps): an FP8 cache read
        keys-wide, tiles that hold whole pages of `page` tokens or lie within one, enough
        pairs."""
        small = self.fp8_full_batch_block_n
        if not (fp8_kv and keys_wide and self.target_programs and small):
            return False
        from_pairs = self.fp8_one_warp_min_pairs or self.target_programs
        # pages the engine lays V out by token for (V by dim would not need it, but no launch
        # has timed or compiled one-warp tiles over such pages)
        fits = lays_out_v_by_token(page) and tile_fits_pages(small, page)
        return bool(self.fp8_full_batch_num_warps) and fits and pairs >= from_pairs

    def tile_shape(self, one_warp: bool) -> tuple[int, int]:
        """(tokens a KV tile, warps a program) of a launch (`one_warp_tiles`)."""
        if one_warp:
            return self.fp8_full_batch_block_n, self.fp8_full_batch_num_warps
        return self.block_n, self.num_warps

    def stages(self, one_warp: bool) -> int:
        """Software-pipeline stages of a launch (`one_warp_tiles`)."""
        if one_warp and self.fp8_one_warp_num_stages:
            return self.fp8_one_warp_num_stages
        return self.num_stages

    def register_cap(self, one_warp: bool) -> int:
        """Registers a thread a launch may use (0: the compiler's choice)."""
        if one_warp and self.fp8_one_warp_max_registers:
            return self.fp8_one_warp_max_registers
        return self.max_registers

    def pieces(
        self,
        num_seqs: int,
        num_kv_heads: int,
        max_visible: int,
        fp8_kv: bool = False,
        one_warp: bool = False,
    ) -> tuple[int, int, int]:
        """(pieces each (sequence, KV head) aims at, the longest piece, the grid's depth: the
        most pieces a visible context of up to `max_visible` positions is cut into), for a
        launch of the default tiles or of the one-warp ones (`one_warp_tiles`)."""
        if one_warp:
            target = self.fp8_one_warp_target_programs or self.target_programs
            splits_wanted = self.splits_per_sequence(num_seqs, num_kv_heads, target)
            split_len = self.longest_piece(1, fp8_kv)
        else:
            splits_wanted = self.splits_per_sequence(num_seqs, num_kv_heads)
            split_len = self.longest_piece(splits_wanted, fp8_kv)
        tile = self.tile_shape(one_warp)[0]
        depth = max(splits_wanted, -(-max_visible // split_len))
        return splits_wanted, split_len, max(1, min(depth, -(-max_visible // tile)))


# The most query rows (a KV head's group x the step's query tokens) the keys-wide tiles take:
# 4 sit in the MMA's narrow side (8) as Ampere-style MMAs. From 8 rows Triton picks Hopper's
# wgmma for those products instead, whose shared-memory copy of V laid out by token does not
# compile (1-byte async copies); and from 8 the rows-wide tiles waste half their 16 rows or less.
KEYS_WIDE_MAX_ROWS = 4
