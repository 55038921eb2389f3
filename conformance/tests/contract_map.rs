//! Every **Contract** bullet in `watukuy_core::store::Store`'s docs names a case that exists, and every
//! store-contract case is named by at least one bullet: the docs and the suite cannot drift.

use std::collections::BTreeSet;

const STORE_DOCS: &str = include_str!("../../core/src/store.rs");

/// The `module::case` names written as `(`module::case`)` in the contract bullets.
fn named_in_docs() -> BTreeSet<String> {
    STORE_DOCS
        .split("(`")
        .skip(1)
        .filter_map(|rest| rest.split_once("`)").map(|(name, _)| name.to_owned()))
        .filter(|name| name.contains("::") && !name.contains(' '))
        .collect()
}

#[test]
fn every_contract_bullet_names_an_existing_case() {
    let cases: BTreeSet<String> = watukuy_conformance::all_cases()
        .iter()
        .map(|c| format!("{}::{}", c.module, c.name))
        .collect();
    let named = named_in_docs();
    assert!(
        named.len() >= 40,
        "expected the contract to name its cases, found {named:?}"
    );
    let missing: Vec<&String> = named.difference(&cases).collect();
    assert!(
        missing.is_empty(),
        "contract bullets name cases that do not exist: {missing:?}"
    );
}

#[test]
fn every_contract_case_is_named_by_a_bullet() {
    let named = named_in_docs();
    let unnamed: Vec<String> = watukuy_conformance::all_cases()
        .iter()
        .filter(|c| {
            !matches!(
                c.module,
                "guarantees" | "engine" | "lanes" | "full_scans" | "chaos"
            )
        })
        .map(|c| format!("{}::{}", c.module, c.name))
        .filter(|path| !named.contains(path))
        .collect();
    assert!(
        unnamed.is_empty(),
        "cases no contract bullet names: {unnamed:?}"
    );
}

#[test]
fn the_suite_has_the_fifty_contract_cases_and_more() {
    let contract = watukuy_conformance::all_cases()
        .iter()
        .filter(|c| {
            !matches!(
                c.module,
                "guarantees" | "engine" | "lanes" | "full_scans" | "chaos"
            )
        })
        .count();
    assert!(
        contract >= 50,
        "the store contract started with 50 cases and only grows; the suite has {contract}"
    );
}
