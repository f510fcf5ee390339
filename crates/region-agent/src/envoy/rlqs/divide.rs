//! Dividing a Region's room among the Envoys that report a limit (pure).
//!
//! Each subscriber first keeps a floor (⌊room / n⌋ each when the floors do
//! not fit). When the demands above the floors fit in the rest, each gets
//! its demand and what no demand asked for is split evenly as headroom for
//! growth; when they do not, the rest is divided **in proportion to
//! demand**, so every request has the same chance of admission whichever
//! Envoy it reached, and the busiest Envoy gets the most. Integer
//! millitokens per second throughout, rounded down: Σ of the result never
//! exceeds the room.

/// The share of `room_mtps` for each entry of `demands_mtps` (millitokens
/// per second), with `floor_mtps` each while the room allows.
pub fn divide(room_mtps: u64, demands_mtps: &[u64], floor_mtps: u64) -> Vec<u64> {
    let n = demands_mtps.len() as u64;
    if n == 0 {
        return Vec::new();
    }
    let floor_each = floor_mtps.min(room_mtps / n);
    let mut rest = room_mtps - floor_each * n;
    let wants: Vec<u64> = demands_mtps
        .iter()
        .map(|d| d.saturating_sub(floor_each))
        .collect();
    let wanted: u128 = wants.iter().map(|&w| w as u128).sum();
    if wanted <= rest as u128 {
        // Every demand fits: met, and the rest is headroom, evenly.
        rest -= wanted as u64;
        let headroom = rest / n;
        return wants.iter().map(|w| floor_each + w + headroom).collect();
    }
    wants
        .iter()
        .map(|&w| floor_each + (rest as u128 * w as u128 / wanted) as u64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_overloaded_room_is_divided_in_proportion_to_demand() {
        // Room 100 t/s, floor 1: demands 5, 200 and 400 t/s above the floor
        // take 97 t/s in the ratio 4 : 199 : 399.
        let got = divide(100_000, &[5_000, 200_000, 400_000], 1_000);
        assert_eq!(got, vec![1_000 + 644, 1_000 + 32_064, 1_000 + 64_290]);
    }

    #[test]
    fn room_no_demand_asked_for_is_headroom_for_everyone() {
        let got = divide(100_000, &[10_000, 10_000], 1_000);
        assert_eq!(got, vec![50_000, 50_000]);
    }

    #[test]
    fn floors_that_do_not_fit_become_an_even_split() {
        let got = divide(3_000, &[0, 0, 0, 0], 1_000);
        assert_eq!(got, vec![750, 750, 750, 750]);
    }

    #[test]
    fn the_busiest_envoy_gets_the_most() {
        let got = divide(100_000, &[1_000, 30_000, 90_000, 200_000], 1_000);
        assert!(got[3] >= got[2] && got[2] >= got[1] && got[1] >= got[0]);
    }

    proptest! {
        /// The invariant the bound rests on: never more than the room.
        #[test]
        fn shares_never_add_up_past_the_room(
            room in 0u64..10_000_000_000,
            demands in proptest::collection::vec(0u64..10_000_000_000, 0..64),
            floor in 0u64..10_000_000,
        ) {
            let got = divide(room, &demands, floor);
            prop_assert_eq!(got.len(), demands.len());
            let sum: u128 = got.iter().map(|&g| g as u128).sum();
            prop_assert!(sum <= room as u128);
        }

        /// Every subscriber keeps the floor when the floors fit, and more
        /// demand never gets less.
        #[test]
        fn floors_hold_and_more_demand_never_gets_less(
            room in 0u64..10_000_000_000,
            demands in proptest::collection::vec(0u64..10_000_000_000, 1..64),
            floor in 0u64..10_000_000,
        ) {
            let got = divide(room, &demands, floor);
            let n = demands.len() as u64;
            let floor_each = floor.min(room / n);
            for (i, &g) in got.iter().enumerate() {
                prop_assert!(g >= floor_each);
                for (j, &h) in got.iter().enumerate() {
                    if demands[i] > demands[j] {
                        prop_assert!(g + 1 >= h, "demand {} got {g}, demand {} got {h}", demands[i], demands[j]);
                    }
                }
            }
        }

        /// When the demands fit, each gets at least its demand.
        #[test]
        fn demands_that_fit_are_met(
            demands in proptest::collection::vec(0u64..1_000_000, 1..32),
            spare in 0u64..1_000_000,
        ) {
            let room = demands.iter().sum::<u64>() + spare;
            let got = divide(room, &demands, 0);
            for (g, d) in got.iter().zip(&demands) {
                prop_assert!(g >= d);
            }
        }
    }
}
