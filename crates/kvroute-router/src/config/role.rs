//! A worker's disaggregation role and SGLang bootstrap port, as given by `[[workers]]`, the
//! admin API or discovery (`kvroute.io/role`, `kvroute.io/bootstrap-port`): one reading and one
//! check for all of them, like [`super::data_parallel`].

use thiserror::Error;

use crate::fleet::{Role, Side, WorkerSpec};

/// What is wrong with a worker's role or bootstrap port, and in which field.
#[derive(Debug, Error, PartialEq)]
#[error("{message}")]
pub struct RoleError {
    /// `role` or `bootstrap_port`.
    pub field: &'static str,
    /// What is wrong and what to write instead.
    pub message: String,
}

/// The role as given: absent means `both` (an ordinary engine).
pub fn worker_role(value: Option<&str>) -> Result<Role, RoleError> {
    value.map_or(Ok(Role::Both), |v| {
        v.parse().map_err(|e: crate::fleet::UnknownRole| RoleError {
            field: "role",
            message: e.to_string(),
        })
    })
}

/// The bootstrap port as given (a number from a file, a body or an annotation): 1 to 65535.
pub fn bootstrap_port(value: Option<i64>) -> Result<Option<u16>, RoleError> {
    value
        .map(|p| {
            u16::try_from(p)
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| RoleError {
                    field: "bootstrap_port",
                    message: format!(
                        "{p} is not a port: give the prefill engine's \
                         --disaggregation-bootstrap-port (1 to 65535)"
                    ),
                })
        })
        .transpose()
}

/// A bootstrap port belongs to a worker that runs prefills (SGLang's bootstrap server runs in
/// the prefill engine): on a decode-only worker it would be silently unused.
pub fn check_role(role: Role, bootstrap_port: Option<u16>) -> Result<(), RoleError> {
    if bootstrap_port.is_some() && !role.serves(Side::Prefill) {
        return Err(RoleError {
            field: "bootstrap_port",
            message: "only a worker that serves prefill (role \"prefill\" or \"both\") runs a \
                      bootstrap server; remove it from this decode worker"
                .into(),
        });
    }
    Ok(())
}

/// Every model the static workers name must be servable: when one of its workers is
/// prefill-only or decode-only, some worker must serve each side (a model with decode workers
/// and no prefill worker would otherwise fail every request at run time). Workers that list no
/// models learn theirs from the engine; the router checks those per request (503).
pub fn check_pools(workers: &[WorkerSpec]) -> Result<(), RoleError> {
    let mut models: Vec<&str> = workers
        .iter()
        .flat_map(|w| w.models.iter().map(String::as_str))
        .collect();
    models.sort_unstable();
    models.dedup();
    for model in models {
        let roles: Vec<Role> = workers
            .iter()
            .filter(|w| w.models.iter().any(|m| m == model))
            .map(|w| w.role)
            .collect();
        if roles.iter().all(|r| *r == Role::Both) {
            continue;
        }
        for side in [Side::Prefill, Side::Decode] {
            if !roles.iter().any(|r| r.serves(side)) {
                return Err(RoleError {
                    field: "role",
                    message: format!(
                        "model `{model}` has {} workers but no {} worker: add a worker with \
                         role \"{}\" or \"both\" for it, or make its workers \"both\"",
                        match side {
                            Side::Prefill => "decode",
                            Side::Decode => "prefill",
                        },
                        side.as_str(),
                        side.as_str()
                    ),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_and_ports_are_read_and_checked() {
        assert_eq!(worker_role(None), Ok(Role::Both));
        assert_eq!(worker_role(Some("decode")), Ok(Role::Decode));
        assert_eq!(worker_role(Some("encode")).unwrap_err().field, "role");
        assert_eq!(bootstrap_port(None), Ok(None));
        assert_eq!(bootstrap_port(Some(8998)), Ok(Some(8998)));
        for bad in [0, -1, 65_536] {
            assert_eq!(
                bootstrap_port(Some(bad)).unwrap_err().field,
                "bootstrap_port"
            );
        }
        assert_eq!(check_role(Role::Prefill, Some(8998)), Ok(()));
        assert_eq!(check_role(Role::Both, Some(8998)), Ok(()));
        assert_eq!(check_role(Role::Decode, None), Ok(()));
        assert_eq!(
            check_role(Role::Decode, Some(8998)).unwrap_err().field,
            "bootstrap_port"
        );
    }
}

#[cfg(test)]
mod pool_tests {
    use super::*;
    use crate::fleet::BaseUrl;

    fn worker(port: u16, model: &str, role: Role) -> WorkerSpec {
        WorkerSpec {
            id: format!("w{port}"),
            url: BaseUrl::parse(&format!("http://h:{port}")).unwrap(),
            models: vec![model.into()],
            kv_events: None,
            kv_replay: None,
            kv_blocks: None,
            data_parallel_size: 1,
            role,
            bootstrap_port: None,
        }
    }

    #[test]
    fn a_disaggregated_model_needs_both_sides() {
        let ok = [
            worker(1, "a", Role::Prefill),
            worker(2, "a", Role::Decode),
            worker(3, "b", Role::Both),
        ];
        assert_eq!(check_pools(&ok), Ok(()));
        let half = [worker(1, "a", Role::Decode), worker(2, "b", Role::Prefill)];
        let e = check_pools(&half).unwrap_err();
        assert!(
            e.message
                .contains("model `a` has decode workers but no prefill worker"),
            "{e}"
        );
        let mixed = [worker(1, "a", Role::Prefill), worker(2, "a", Role::Both)];
        assert_eq!(check_pools(&mixed), Ok(()));
    }
}
