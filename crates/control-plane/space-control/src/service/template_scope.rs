//! Whose a template is, and which template a caller's name means.
//!
//! Shared templates are the operator's (`base`, `python:3.12`): every tenant may start
//! sandboxes from them, only the operator builds or deletes them. Every other tenant
//! builds its own, which only it (and the operator) can see or use: on the nodes their
//! full name carries the owner, `tnt-….NAME[:TAG]`
//! (`space_core::template::OWNER_SEPARATOR`), so two tenants' `app` are two templates.
//!
//! - A tenant's `NAME` means its own `NAME` if it has one, else the shared `NAME`; it may
//!   also write its own full name. Another tenant's full name is as unknown to it as a
//!   name that does not exist (its existence is not revealed).
//! - A tenant builds and deletes `NAME` as its own.
//! - The operator's `NAME` is the shared one; it may name any tenant's by its full name.
//!
//! Pure: the callers look the names up.

use space_core::template::{
    canonical_template_name, owned_template_name, split_template_owner, TemplateInfo,
};
use space_core::ErrorCode;

use crate::api::error::ApiError;
use crate::service::Caller;

/// The full names `name` may mean for `caller`, in the order they are tried.
pub fn candidates(caller: &Caller, name: &str) -> Result<Vec<String>, ApiError> {
    let full = canonical(name)?;
    match split_template_owner(&full) {
        (Some(owner), _) if caller.is_operator() || owner == caller.id.as_str() => Ok(vec![full]),
        (Some(_), _) => Err(not_found(&full)),
        (None, _) if caller.is_operator() => Ok(vec![full]),
        (None, unowned) => Ok(vec![owned_template_name(&caller.id, unowned), full]),
    }
}

/// The full name of the template `caller` builds or deletes as `name`.
pub fn own(caller: &Caller, name: &str) -> Result<String, ApiError> {
    let full = canonical(name)?;
    match split_template_owner(&full) {
        (Some(owner), _) if caller.is_operator() || owner == caller.id.as_str() => Ok(full),
        (Some(_), _) => Err(ApiError::new(
            ErrorCode::Forbidden,
            format!("template {full} is another tenant's"),
        )),
        (None, _) if caller.is_operator() => Ok(full),
        (None, unowned) => Ok(owned_template_name(&caller.id, unowned)),
    }
}

/// Whether `caller` may see and use the template called (in full) `name`.
pub fn visible(caller: &Caller, name: &str) -> bool {
    match split_template_owner(name) {
        (Some(owner), _) => caller.is_operator() || owner == caller.id.as_str(),
        (None, _) => true,
    }
}

/// Whether `template` is a tenant's own (not shared).
pub fn is_owned(template: &TemplateInfo) -> bool {
    split_template_owner(&template.name).0.is_some()
}

/// `name` in its one spelling, or `400` saying what a name is.
pub fn canonical(name: &str) -> Result<String, ApiError> {
    canonical_template_name(name).ok_or_else(|| {
        ApiError::invalid(format!(
            "invalid template name {:?}: NAME or NAME:TAG, NAME of [a-z0-9_-] (at most 63), TAG of [A-Za-z0-9_.-] (at most 128); a tenant's own template's full name is TENANT.NAME",
            name.chars().take(80).collect::<String>()
        ))
    })
}

/// `404` for a template name.
pub fn not_found(name: &str) -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        format!(
            "template '{}' not found",
            name.chars().take(200).collect::<String>()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(name: &str) -> Caller {
        Caller {
            id: space_core::TenantId::generate(),
            name: name.into(),
            key_id: "k".into(),
        }
    }

    #[test]
    fn a_tenants_name_means_its_own_template_first() {
        let t = caller("acme");
        let own_py = format!("{}.py", t.id);
        assert_eq!(candidates(&t, "py").unwrap(), [own_py.clone(), "py".into()]);
        assert_eq!(candidates(&t, &own_py).unwrap(), vec![own_py.clone()]);
        assert_eq!(own(&t, "py:latest").unwrap(), own_py);
        assert!(visible(&t, &own_py) && visible(&t, "py"));

        let other = caller("other");
        let theirs = format!("{}.py", other.id);
        let e = candidates(&t, &theirs).unwrap_err();
        assert_eq!(e.body.code, ErrorCode::NotFound);
        assert_eq!(
            own(&t, &theirs).unwrap_err().body.code,
            ErrorCode::Forbidden
        );
        assert!(!visible(&t, &theirs));

        let op = caller(crate::bootstrap::DEFAULT_TENANT);
        assert_eq!(candidates(&op, "py").unwrap(), ["py"]);
        assert_eq!(own(&op, "py").unwrap(), "py");
        assert_eq!(own(&op, &theirs).unwrap(), theirs);
        assert!(visible(&op, &theirs));
        assert_eq!(
            candidates(&t, "Bad").unwrap_err().body.code,
            ErrorCode::InvalidRequest
        );
    }
}
