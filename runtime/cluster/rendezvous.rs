//! Which live node should run a resident: rendezvous (highest random weight) hashing. Every
//! node computes the same answer from the same list of live nodes, with no coordination, and
//! when a node joins or leaves only the residents that should move do (about 1/n of them).

use sha2::{Digest, Sha256};

/// The node of `live` that should run `name`: the one whose hash with the name is highest.
/// `None` when no node is alive.
pub fn owner<'a>(name: &str, live: &'a [String]) -> Option<&'a str> {
    live.iter()
        .max_by_key(|node| weight(name, node))
        .map(String::as_str)
}

fn weight(name: &str, node: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update([0]);
    h.update(node.as_bytes());
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("node-{i}")).collect()
    }

    #[test]
    fn every_node_agrees_and_the_residents_are_spread() {
        let live = nodes(3);
        let mut count = [0usize; 3];
        for i in 0..600 {
            let name = format!("r{i}");
            let a = owner(&name, &live).unwrap();
            let mut reversed = live.clone();
            reversed.reverse();
            assert_eq!(
                Some(a),
                owner(&name, &reversed),
                "the order of the list matters"
            );
            count[live.iter().position(|n| n == a).unwrap()] += 1;
        }
        for c in count {
            assert!((120..=280).contains(&c), "uneven spread: {count:?}");
        }
        assert_eq!(owner("x", &[]), None);
    }

    #[test]
    fn a_node_leaving_moves_only_its_own_residents() {
        let three = nodes(3);
        let two: Vec<String> = three[..2].to_vec();
        for i in 0..300 {
            let name = format!("r{i}");
            let before = owner(&name, &three).unwrap();
            let after = owner(&name, &two).unwrap();
            if before != "node-3" {
                assert_eq!(before, after, "{name} moved though its node stayed");
            }
        }
    }
}
