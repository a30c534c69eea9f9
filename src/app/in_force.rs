//! What the App reads of the config in force (its rules, its workspaces'
//! approval modes, what it warns about, what waits for a restart, a broken
//! or held edit), kept as one snapshot that a reload replaces whole.
//!
//! Why one snapshot: these used to be four locks, each swapped on its own,
//! so `/healthz` could read a reload half applied (new warnings beside the
//! previous error). A reader now takes one `Arc` and sees one moment.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

use intercom_actors::rules::{ApprovalMode, Rule};

/// One moment of the config in force, as the App reads it.
#[derive(Debug, Clone, Default)]
pub(super) struct InForce {
    /// The rules from the config file (plus, during a hold, the deny and
    /// ask rules the held save adds).
    pub rules: Vec<Rule>,
    /// `[[workspace]] approval_mode` per workspace.
    pub modes: BTreeMap<String, ApprovalMode>,
    /// What the config warns about (a missing agent binary or workspace
    /// directory): logged at each load, counted in `/healthz`.
    pub warnings: Vec<String>,
    /// What the last reload changed that takes a restart.
    pub restart_needed: Vec<&'static str>,
    /// Why the config is stale (the last edit was invalid, or applied in
    /// part); `None` when the last reload was applied whole.
    pub error: Option<String>,
    /// What a held reload waits for (see `config::confirm`); `None` when
    /// nothing is held.
    pub held: Option<String>,
}

/// The snapshot, replaced whole under a lock held only to swap an `Arc`.
#[derive(Debug)]
pub(super) struct ConfigInForce(RwLock<Arc<InForce>>);

impl ConfigInForce {
    pub(super) fn new(first: InForce) -> Self {
        ConfigInForce(RwLock::new(Arc::new(first)))
    }

    /// The snapshot now. A poisoned lock still holds a whole snapshot (it
    /// is only ever replaced whole), so it is read, never skipped: a new
    /// deny rule must not be missed for a panic elsewhere.
    pub(super) fn now(&self) -> Arc<InForce> {
        Arc::clone(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Replaces the snapshot with `change` applied to a copy of it: readers
    /// see the old one or the new one, never a mix.
    pub(super) fn change(&self, change: impl FnOnce(&mut InForce)) {
        let mut slot = self.0.write().unwrap_or_else(PoisonError::into_inner);
        let mut next = InForce::clone(&slot);
        change(&mut next);
        *slot = Arc::new(next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_keeps_the_moment_it_took_while_a_change_lands() {
        let in_force = ConfigInForce::new(InForce {
            error: Some("bad edit".into()),
            ..InForce::default()
        });
        let before = in_force.now();
        in_force.change(|c| {
            c.error = None;
            c.warnings = vec!["agent \"x\": command does not exist".into()];
        });
        assert_eq!(before.error.as_deref(), Some("bad edit"));
        assert!(before.warnings.is_empty(), "the old moment is whole");
        let after = in_force.now();
        assert_eq!(after.error, None);
        assert_eq!(after.warnings.len(), 1);
    }

    #[test]
    fn a_poisoned_snapshot_is_still_read_and_changed() {
        let in_force = Arc::new(ConfigInForce::new(InForce::default()));
        let poisoner = Arc::clone(&in_force);
        let panicked = std::thread::spawn(move || {
            poisoner.change(|_| panic!("a panic while changing"));
        })
        .join();
        assert!(panicked.is_err());
        in_force.change(|c| c.held = Some("an allow rule changed".into()));
        assert_eq!(
            in_force.now().held.as_deref(),
            Some("an allow rule changed")
        );
    }
}
