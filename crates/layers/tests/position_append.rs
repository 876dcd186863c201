//! KV-cache append chunk sizing against the origin's table and rule
//! (`qwen-append.ts`), and the regime property it is meant to keep.

use layers::position::{Backend, RegimeTable, MAX_APPEND_CHUNK};
use proptest::prelude::*;

#[test]
fn metal_table_is_the_origins() {
    let table = RegimeTable::metal();
    assert_eq!(table.backend(), Backend::Metal);
    assert_eq!(table.boundaries(), &[1023, 1024, 8192, 32768, 65536]);
}

#[test]
fn cpu_table_is_empty_until_measured() {
    let table = RegimeTable::cpu();
    assert_eq!(table.backend(), Backend::Cpu);
    assert!(table.boundaries().is_empty());
    for cache_len in [0, 1, 1023, 70_000] {
        assert_eq!(table.append_chunk_size(cache_len), MAX_APPEND_CHUNK);
    }
}

/// `RegimeTable::cuda()` is the H200 measurement of 2026-12-01 (boundary
/// finder on the conformance attention graph: chunks of 4 failed at 57 of
/// 64 dense candidates, failing from KV 1026 on without end): one token
/// at a time, everywhere.
#[test]
fn cuda_table_appends_one_token_at_a_time_as_measured() {
    let table = RegimeTable::cuda();
    assert_eq!(table.backend(), Backend::Cuda);
    assert!(table.boundaries().is_empty());
    assert_eq!(table.max_chunk(), 1);
    for cache_len in [0, 1, 134, 135, 1023, 1026, 65_536, 70_000] {
        assert_eq!(table.append_chunk_size(cache_len), 1, "cache {cache_len}");
    }
    assert_eq!(RegimeTable::cpu().max_chunk(), MAX_APPEND_CHUNK);
}

#[test]
fn metal_chunks_near_the_boundaries() {
    let table = RegimeTable::metal();
    let cases = [
        (0, 4),
        (1018, 4),
        (1019, 4),
        (1020, 3),
        (1022, 1),
        (1023, 1),
        (1024, 4),
        (8190, 2),
        (8192, 4),
        (32767, 1),
        (65535, 1),
        (65536, 4),
        (1_000_000, 4),
    ];
    for (cache_len, chunk) in cases {
        assert_eq!(
            table.append_chunk_size(cache_len),
            chunk,
            "cache_len {cache_len}"
        );
    }
}

#[test]
fn measured_table() {
    let table = RegimeTable::from_measured(Backend::Cpu, vec![10, 12]).unwrap();
    assert_eq!(table.append_chunk_size(8), 2);
    assert_eq!(table.append_chunk_size(10), 2);
    assert_eq!(table.append_chunk_size(12), 4);
    assert_eq!(table.regime(10), 0);
    assert_eq!(table.regime(11), 1);
    assert_eq!(table.regime(13), 2);
}

/// The origin's loop, verbatim in Rust.
fn origin_chunk(boundaries: &[usize], cache_tokens: usize) -> usize {
    for &end in boundaries {
        if cache_tokens < end {
            return 4.min(end - cache_tokens);
        }
    }
    4
}

proptest! {
    #[test]
    fn chunk_is_the_largest_single_regime_span(
        mut boundaries in prop::collection::btree_set(1usize..200, 0..8)
            .prop_map(|s| s.into_iter().collect::<Vec<_>>()),
        cache_len in 0usize..220,
    ) {
        boundaries.sort_unstable();
        let table = RegimeTable::from_measured(Backend::Cpu, boundaries.clone()).unwrap();
        let chunk = table.append_chunk_size(cache_len);
        prop_assert_eq!(chunk, origin_chunk(&boundaries, cache_len));
        prop_assert!((1..=MAX_APPEND_CHUNK).contains(&chunk));
        let regime = table.regime(cache_len + 1);
        for n in cache_len + 1..=cache_len + chunk {
            prop_assert_eq!(table.regime(n), regime);
        }
        if chunk < MAX_APPEND_CHUNK {
            prop_assert_ne!(table.regime(cache_len + chunk + 1), regime);
        }
    }
}
