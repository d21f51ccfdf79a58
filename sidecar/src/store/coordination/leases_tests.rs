//! The waiters' registrations (`Leases::waiting`): none outlives its waiters, and a waiter
//! whose registration was woken never takes a newer one with it.

use super::Leases;

fn registered(l: &Leases) -> usize {
    l.waiting().len()
}

#[test]
fn a_woken_waiter_leaves_the_next_waiters_registration() {
    let leases = Leases::new("t:", true);
    let first = leases.attempt("read").expect("enabled");
    let key = first.key.clone();
    // The holder's release wakes the first waiter: its registration goes.
    leases.wake(&key);
    assert_eq!(registered(&leases), 0);
    // A second read registers anew, then the first waiter goes.
    let second = leases.attempt("read").expect("enabled");
    drop(first);
    assert_eq!(
        registered(&leases),
        1,
        "the second waiter's registration was taken by the first's drop: its wake-up is lost"
    );
    drop(second);
    assert_eq!(registered(&leases), 0, "the last waiter leaves nothing");
}
