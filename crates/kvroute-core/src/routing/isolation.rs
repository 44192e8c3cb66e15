//! Placement isolation: a tenant over its fair share is kept on its share of the workers
//! while other tenants are active, so their requests find workers it does not occupy.
//!
//! Why: fair admission (the router's slots, `shaping`) bounds how many requests a flooding
//! tenant runs, not where they run. An engine batches a new prompt's prefill with the decodes
//! of every sequence it runs and charges the sum, so a tenant whose requests share an engine
//! with a flood's sequences waits for the flood's decodes in every step (measured, no router:
//! 1.16–1.67× its time to first token alone with one to four of them on the engine,
//! `docs/benchmarks.md`, "Traffic shaping"). Spread over every worker, the flood slows every other tenant;
//! confined to its share of the workers (like shuffle sharding), it leaves the rest to them.
//!
//! The rule, over one decision's candidates and what each runs per tenant
//! ([`crate::fleet::Tenancy`]):
//! - [`Stance::Over`] (the tenant holds more than its weighted fair share of the router's
//!   slots while another tenant is active): its candidates are the `ceil(n · w / W)` workers
//!   it occupies most (then those fewest other tenants' requests run on), `w / W` its share.
//! - [`Stance::Within`] (at or under its share while some tenant is over): its candidates are
//!   the workers the over-share tenants run fewest requests on (none, when one is free of them).
//! - [`Stance::Free`] (alone, or isolation off): every candidate.
//!
//! It only narrows candidates the decision already found routable, and the policy still
//! chooses among them, so it never pins a request onto an unhealthy, draining or
//! circuit-open worker (a refused probe leaves the candidates and the rule is asked again)
//! and never refuses one; with no other tenant active nothing is narrowed (work-conserving).
//! Who is over and who is active is the caller's to say (the router's admission book); this
//! is pure.

use std::sync::Arc;

use crate::fleet::Occupants;

/// A request's tenant and where it stands against the other tenants.
#[derive(Clone, Debug, PartialEq)]
pub struct Standing {
    /// Its tenant (the flow the admission queue shares slots by), counted on its worker.
    pub tenant: Arc<str>,
    /// What isolation does with its candidates.
    pub stance: Stance,
}

/// What isolation does with a request's candidates; see the module's documentation.
#[derive(Clone, Debug, PartialEq)]
pub enum Stance {
    /// Every candidate: its tenant is alone, or isolation is off.
    Free,
    /// Confined to its share of the workers: its tenant's `weight` of the active tenants'
    /// `active_weight` (itself included).
    Over {
        /// Its tenant's weight.
        weight: u32,
        /// The weight of every active tenant, its own included.
        active_weight: u32,
    },
    /// Kept off the workers of the tenants named (those over their share).
    Within {
        /// The tenants over their share.
        over: Vec<Arc<str>>,
    },
}

/// Which rule narrowed a decision's candidates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Confined {
    /// An over-share tenant's request, kept on its share of the workers.
    Over,
    /// Another tenant's request, kept off the over-share tenants' workers.
    Within,
}

impl Confined {
    /// Its name in metrics and explanations.
    pub fn as_str(self) -> &'static str {
        match self {
            Confined::Over => "over_share",
            Confined::Within => "within_share",
        }
    }
}

/// The candidates `standing` may use, by index into `occupants` (what each candidate runs per
/// tenant, in candidate order), and which rule chose them; `None` when it may use every one.
pub fn confine(standing: &Standing, occupants: &[Occupants]) -> Option<(Confined, Vec<usize>)> {
    let n = occupants.len();
    if n < 2 {
        return None;
    }
    let count = |o: &Occupants, pred: &dyn Fn(&str) -> bool| -> u64 {
        o.iter()
            .filter(|(t, _)| pred(t))
            .map(|(_, c)| u64::from(*c))
            .sum()
    };
    let allowed = match &standing.stance {
        Stance::Free => return None,
        Stance::Over {
            weight,
            active_weight,
        } => {
            let quota = workers_share(n, *weight, *active_weight);
            if quota >= n {
                return None;
            }
            let own = |o: &Occupants| count(o, &|t| t == &*standing.tenant);
            let others = |o: &Occupants| count(o, &|t| t != &*standing.tenant);
            let mut ranked: Vec<usize> = (0..n).collect();
            ranked.sort_by_key(|&i| {
                (
                    std::cmp::Reverse(own(&occupants[i])),
                    others(&occupants[i]),
                    i,
                )
            });
            ranked.truncate(quota);
            ranked.sort_unstable();
            (Confined::Over, ranked)
        }
        Stance::Within { over } => {
            let flood = |o: &Occupants| count(o, &|t| over.iter().any(|x| &**x == t));
            let least = occupants.iter().map(flood).min()?;
            let free: Vec<usize> = (0..n).filter(|&i| flood(&occupants[i]) == least).collect();
            if free.len() == n {
                return None;
            }
            (Confined::Within, free)
        }
    };
    Some(allowed)
}

/// `ceil(n · weight / active_weight)` of `n` workers, at least one (integers: a float's
/// rounding must not give a third of three workers two).
pub fn workers_share(n: usize, weight: u32, active_weight: u32) -> usize {
    let (w, total) = (u64::from(weight.max(1)), u64::from(active_weight.max(1)));
    let share = (n as u64 * w).div_ceil(total.max(w));
    usize::try_from(share).unwrap_or(n).clamp(1, n.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn occ(counts: &[(&str, u32)]) -> Occupants {
        counts.iter().map(|(t, n)| (Arc::from(*t), *n)).collect()
    }

    fn standing(tenant: &str, stance: Stance) -> Standing {
        Standing {
            tenant: tenant.into(),
            stance,
        }
    }

    fn over(weight: u32, active_weight: u32) -> Stance {
        Stance::Over {
            weight,
            active_weight,
        }
    }

    #[test]
    fn an_over_share_tenant_keeps_to_its_share_of_the_workers_it_occupies_most() {
        let fleet = [
            occ(&[("a", 1), ("b", 1)]),
            occ(&[("a", 3)]),
            occ(&[]),
            occ(&[("b", 2)]),
        ];
        let a = standing("a", over(1, 2));
        // Half of four workers: the two it runs on, most first.
        assert_eq!(confine(&a, &fleet), Some((Confined::Over, vec![0, 1])));
        // A third of three is one; a weight of two among three tenants' four is two of four.
        assert_eq!(
            confine(&standing("a", over(1, 3)), &fleet[..3]),
            Some((Confined::Over, vec![1]))
        );
        assert_eq!(
            confine(&standing("a", over(2, 4)), &fleet),
            Some((Confined::Over, vec![0, 1]))
        );
        // Three quarters: three of four, the unoccupied one before the busiest with others.
        assert_eq!(
            confine(&standing("a", over(3, 4)), &fleet),
            Some((Confined::Over, vec![0, 1, 2]))
        );
        // Nothing to narrow: a share of every worker, a single worker, or no rule.
        assert_eq!(confine(&standing("a", over(7, 8)), &fleet), None);
        assert_eq!(confine(&a, &fleet[..1]), None);
        assert_eq!(confine(&standing("a", Stance::Free), &fleet), None);
        // One worker of four (a quarter): the one it runs most on.
        assert_eq!(
            confine(&standing("a", over(1, 4)), &fleet),
            Some((Confined::Over, vec![1]))
        );
        // Occupying nothing yet, it starts where the fewest others' requests run.
        let none = [
            occ(&[("b", 2)]),
            occ(&[("c", 1)]),
            occ(&[("b", 1), ("c", 1)]),
        ];
        let third = standing("a", over(1, 3));
        assert_eq!(confine(&third, &none), Some((Confined::Over, vec![1])));
    }

    #[test]
    fn a_tenant_within_its_share_keeps_off_the_over_share_tenants_workers() {
        let b = standing(
            "b",
            Stance::Within {
                over: vec!["a".into(), "c".into()],
            },
        );
        let fleet = [
            occ(&[("a", 4)]),
            occ(&[("b", 1), ("d", 5)]),
            occ(&[("c", 1)]),
            occ(&[]),
        ];
        assert_eq!(confine(&b, &fleet), Some((Confined::Within, vec![1, 3])));
        // Every worker runs some of them: the ones running fewest.
        let crowded = [
            occ(&[("a", 4)]),
            occ(&[("a", 1), ("c", 1)]),
            occ(&[("c", 2)]),
        ];
        assert_eq!(confine(&b, &crowded), Some((Confined::Within, vec![1, 2])));
        // All alike: nothing to prefer.
        let even = [occ(&[("a", 1)]), occ(&[("c", 1)])];
        assert_eq!(confine(&b, &even), None);
        let nobody = standing("b", Stance::Within { over: vec![] });
        assert_eq!(confine(&nobody, &fleet), None);
    }

    #[test]
    fn the_share_of_workers_is_a_rounded_up_integer_fraction() {
        assert_eq!(workers_share(3, 1, 3), 1);
        assert_eq!(workers_share(2, 1, 2), 1);
        assert_eq!(workers_share(5, 1, 2), 3);
        assert_eq!(workers_share(4, 1, 100), 1, "at least one");
        assert_eq!(workers_share(4, 3, 1), 4, "never more than all");
        assert_eq!(workers_share(4, 0, 0), 4, "weights are at least one");
    }
}
