//! Claim values many tokens share (issuer, tenant, agent, subject, the
//! project and scope lists), held once: the verified-token cache keeps a
//! token per run, and tokens of one agent differ only in their run and id.
//!
//! Bounded: past [`MAX_VALUES`] distinct values of a kind, new ones are
//! simply not shared (an issuer minting a fresh subject per run costs what
//! it did before, never more).

use std::hash::Hash;
use std::sync::Arc;

use dashmap::DashSet;

/// Most distinct values kept per kind.
pub(crate) const MAX_VALUES: usize = 4096;

/// One kind of shared value.
struct Pool<T: ?Sized + Eq + Hash> {
    set: DashSet<Arc<T>>,
}

impl<T: ?Sized + Eq + Hash> Pool<T> {
    fn new() -> Self {
        Pool {
            set: DashSet::new(),
        }
    }

    /// The shared copy of `value`, made by `make` if there is none yet.
    fn get(&self, value: &T, make: impl FnOnce() -> Arc<T>) -> Arc<T> {
        if let Some(held) = self.set.get(value) {
            return Arc::clone(&held);
        }
        let made = make();
        if self.set.len() < MAX_VALUES {
            self.set.insert(Arc::clone(&made));
        }
        made
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.set.len()
    }
}

/// The shared claim values of one verifier.
pub(crate) struct SharedClaims {
    text: Pool<str>,
    lists: Pool<[String]>,
}

impl SharedClaims {
    pub(crate) fn new() -> Self {
        SharedClaims {
            text: Pool::new(),
            lists: Pool::new(),
        }
    }

    /// A claim's text, shared.
    pub(crate) fn text(&self, value: &str) -> Arc<str> {
        self.text.get(value, || Arc::from(value))
    }

    /// A claim's list, shared.
    pub(crate) fn list(&self, value: Vec<String>) -> Arc<[String]> {
        self.lists.get(&value, || Arc::from(value.as_slice()))
    }

    /// Distinct values held (texts, lists).
    #[cfg(test)]
    pub(crate) fn len(&self) -> (usize, usize) {
        (self.text.len(), self.lists.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_allocation() {
        let s = SharedClaims::new();
        let a = s.text("tenant-a");
        let b = s.text(&String::from("tenant-a"));
        assert!(Arc::ptr_eq(&a, &b));
        let c = s.text("tenant-b");
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(&*c, "tenant-b");

        let l1 = s.list(vec!["p1".into(), "p2".into()]);
        let l2 = s.list(vec!["p1".into(), "p2".into()]);
        assert!(Arc::ptr_eq(&l1, &l2));
        let l3 = s.list(vec!["p2".into(), "p1".into()]);
        assert!(!Arc::ptr_eq(&l1, &l3), "order is part of the list");
        assert_eq!(s.len(), (2, 2));
    }

    #[test]
    fn past_the_bound_values_are_made_but_not_kept() {
        let s = SharedClaims::new();
        for i in 0..MAX_VALUES + 10 {
            let v = format!("sub-{i}");
            assert_eq!(&*s.text(&v), v);
        }
        assert_eq!(s.len().0, MAX_VALUES);
        let late = format!("sub-{}", MAX_VALUES + 5);
        let x = s.text(&late);
        let y = s.text(&late);
        assert_eq!(x, y);
        assert!(!Arc::ptr_eq(&x, &y), "a value past the bound is not shared");
    }
}
