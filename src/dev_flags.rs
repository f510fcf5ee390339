//! Parsers of `leasehold dev` flags that need nothing of the dev cluster.

/// Largest `--demo-scale` (at scale 10 and cost 1 the demo offers 120,000 Checks/s).
pub const MAX_DEMO_SCALE: f64 = 10.0;

/// `--demo-scale`: a number in (0, [`MAX_DEMO_SCALE`]].
pub fn parse_demo_scale(value: &str) -> Result<f64, String> {
    let scale: f64 = value
        .parse()
        .map_err(|_| format!("{value:?} is not a number"))?;
    if !(scale > 0.0 && scale <= MAX_DEMO_SCALE) {
        return Err(format!("{value} is outside (0, {MAX_DEMO_SCALE}]"));
    }
    Ok(scale)
}
