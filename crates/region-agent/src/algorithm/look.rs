//! Twin of `lua/look.lua`: a decision call of a lookable kind answered as
//! it would be, with nothing written. The Lua runs the inner body on a
//! `redis` that drops writes; the twin runs the inner twin and puts every
//! key it names back (a script touches only the keys it names, so that
//! undoes the whole call). Both answer the charge's reply exactly: the
//! bodies never read back what they wrote in the same call.
//!
//! One difference in state, none in answers: sliding_log's trim of entries
//! already out of its window stays done on Redis and is undone here; every
//! later call trims them again before it counts.

use crate::store::keyspace::Keyspace;
use crate::store::script::{ScriptCall, ScriptError, ScriptKind};

pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let kind = argv
        .first()
        .and_then(|name| {
            ScriptKind::ALL
                .into_iter()
                .find(|kind| kind.lookable() && kind.name() == name)
        })
        .ok_or_else(|| ScriptError::InvalidArgument("look".into()))?;
    // A gate looked at runs its inner call from the read-only bodies,
    // which hold no lease_block: the Lua refuses it as an unknown inner.
    let gated_inner = argv.get(1).map(String::as_str);
    let lookable_inner = ScriptKind::ALL
        .into_iter()
        .any(|k| k.gateable() && k.lookable() && Some(k.name()) == gated_inner);
    if kind == ScriptKind::ShareGate && !lookable_inner {
        return Err(ScriptError::InvalidArgument("gated".into()));
    }
    let inner = ScriptCall {
        kind,
        keys: keys.to_vec(),
        args: argv[1..].to_vec(),
    };
    let before = space.snapshot(keys);
    let reply = super::eval(space, &inner, now_ms);
    space.restore(before);
    reply
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::script::look_call;

    fn window(cost: u64) -> ScriptCall {
        ScriptCall::new(ScriptKind::FixedWindow)
            .key("lh:v1:{t}:w:p")
            .arg(2)
            .arg(60_000)
            .arg(cost)
            .arg(0)
    }

    #[test]
    fn a_look_answers_as_the_charge_would_and_writes_nothing() {
        let mut space = Keyspace::new();
        let now = 1_000;
        let charge = |space: &mut Keyspace| super::super::eval(space, &window(1), now).unwrap();
        let look =
            |space: &mut Keyspace| super::super::eval(space, &look_call(&window(1)), now).unwrap();
        // Empty: the look says a hit fits and leaves the key absent.
        assert_eq!(look(&mut space), vec![1, 1, 0, now]);
        assert_eq!(space.held_keys(), 0);
        assert_eq!(charge(&mut space), vec![1, 1, 0, now]);
        // Looked at any number of times, the window still holds one more.
        for _ in 0..3 {
            assert_eq!(look(&mut space), vec![1, 0, 0, now]);
        }
        assert_eq!(charge(&mut space), vec![1, 0, 0, now]);
        // Full: the look is refused as the third charge is.
        let refused = look(&mut space);
        assert_eq!(refused[0], 0);
        assert_eq!(refused, charge(&mut space));
    }

    #[test]
    fn only_lookable_kinds_are_looked_at() {
        let mut space = Keyspace::new();
        let call = ScriptCall::new(ScriptKind::Look)
            .key("k")
            .arg("give_back")
            .arg(1);
        assert_eq!(
            eval(&mut space, &call.keys, &call.args, 0),
            Err(ScriptError::InvalidArgument("look".into()))
        );
        assert_eq!(
            eval(&mut space, &[], &[], 0),
            Err(ScriptError::InvalidArgument("look".into()))
        );
    }
}
