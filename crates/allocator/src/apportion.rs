//! Exact integer splits: the one rounding rule of the state machine.
//!
//! Targets (§4.3 step 3), named grants in proportion to need (step 6) and the
//! equal split of reclaimed room (§4.4) all split an integer amount by integer
//! weights. [`apportion`] does it with the largest-remainder method, so the
//! parts always sum to the amount exactly and Σ = L is never off by rounding.

/// Splits `amount` into one part per weight, proportional to the weights,
/// with Σ parts = `amount` exactly.
///
/// Each part starts at ⌊amount × weight / Σ weights⌋; the units left over
/// (fewer than the number of weights) go one each to the parts with the
/// largest remainders, ties to the lower index. All weights zero means equal
/// weights (so the left-over units go to the lowest indices). A part is never
/// above ⌈amount × weight / Σ weights⌉.
pub fn apportion(amount: u64, weights: &[u64]) -> Vec<u64> {
    if weights.is_empty() {
        return Vec::new();
    }
    let all_zero = weights.iter().all(|&weight| weight == 0);
    let weight_of = |weight: u64| if all_zero { 1 } else { u128::from(weight) };
    let total: u128 = weights.iter().map(|&weight| weight_of(weight)).sum();
    let mut parts = Vec::with_capacity(weights.len());
    let mut remainders = Vec::with_capacity(weights.len());
    for (index, &weight) in weights.iter().enumerate() {
        let product = u128::from(amount) * weight_of(weight);
        // Proven: weight ≤ total, so product / total ≤ amount fits in u64.
        parts.push((product / total) as u64);
        remainders.push((product % total, index));
    }
    let given: u64 = parts.iter().sum();
    let left_over = amount - given;
    debug_assert!(left_over < weights.len() as u64);
    remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, index) in remainders.iter().take(left_over as usize) {
        parts[index] += 1;
    }
    debug_assert_eq!(parts.iter().sum::<u64>(), amount);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn exact_proportions_need_no_rounding() {
        assert_eq!(
            apportion(8_500, &[7_200, 3_600, 1_200]),
            vec![5_100, 2_550, 850]
        );
    }

    #[test]
    fn zero_weights_split_equally_with_left_over_to_the_lowest_index() {
        assert_eq!(apportion(10, &[0, 0, 0]), vec![4, 3, 3]);
        assert_eq!(apportion(0, &[0, 0]), vec![0, 0]);
    }

    #[test]
    fn left_over_goes_to_the_largest_remainder() {
        // 10 × 1/6 = 1.67, 10 × 2/6 = 3.33, 10 × 3/6 = 5: one unit left, to index 0.
        assert_eq!(apportion(10, &[1, 2, 3]), vec![2, 3, 5]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn parts_sum_exactly_and_stay_within_one_of_the_share(
            amount in 0u64..=(1 << 40),
            weights in proptest::collection::vec(0u64..=(1 << 40), 1..16),
        ) {
            let parts = apportion(amount, &weights);
            prop_assert_eq!(parts.iter().sum::<u64>(), amount);
            let total: u128 = weights.iter().map(|&w| u128::from(w)).sum();
            for (part, &weight) in parts.iter().zip(&weights) {
                let exact_floor = (u128::from(amount) * u128::from(weight))
                    .checked_div(total)
                    .unwrap_or(u128::from(amount) / weights.len() as u128);
                prop_assert!(u128::from(*part) >= exact_floor);
                prop_assert!(u128::from(*part) <= exact_floor + 1);
            }
        }
    }
}
