//! Shape arithmetic shared by the layers' input checks.

/// The shape NumPy broadcasting gives `a` and `b` (MLX's
/// `broadcast_shapes`): axes aligned from the right, each pair equal or one
/// of them 1. `None` where MLX raises `[broadcast_shapes]`.
///
/// The layers use it to accept exactly the inputs the reference's
/// broadcasting accepts, and to refuse the others with a typed error
/// before MLX would.
pub(crate) fn broadcast(a: &[i32], b: &[i32]) -> Option<Vec<i32>> {
    let rank = a.len().max(b.len());
    let axis = |s: &[i32], i: usize| {
        // Missing leading axes count as 1.
        (i + s.len()).checked_sub(rank).map_or(1, |j| s[j])
    };
    (0..rank)
        .map(|i| match (axis(a, i), axis(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::broadcast;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast(&[2, 64], &[64]), Some(vec![2, 64]));
        assert_eq!(broadcast(&[2, 64], &[1]), Some(vec![2, 64]));
        assert_eq!(
            broadcast(&[1, 1, 4, 16], &[3, 2, 1, 16]),
            Some(vec![3, 2, 4, 16])
        );
        assert_eq!(broadcast(&[], &[3]), Some(vec![3]));
        assert_eq!(broadcast(&[2, 64], &[65]), None);
        assert_eq!(broadcast(&[2, 3], &[4, 3]), None);
    }
}
