//! Attempts order as every store reads it: three parts, each read in (attempts, id) order and
//! merged (tried more than once, the first tries, never tried), so that no part sorts the bulk of
//! first tries; and the position of a keyset cursor or a window's far end reduced to what it means
//! for each part ([`PartBound`]), so that each part's bound is a range of its index (a first
//! try's order is its id alone).

use crate::console::filter::SortOrder;

/// One part of attempts order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptsPart {
    /// Attempts above 1.
    Retried,
    /// Attempts 1: the bulk, in id order.
    FirstTry,
    /// Attempts below 1 (claimed, not yet run).
    Untried,
}

impl AttemptsPart {
    /// The parts, in descending attempts order.
    pub(crate) const ALL: [Self; 3] = [Self::Retried, Self::FirstTry, Self::Untried];

    /// The part's condition on `{prefix}attempts`.
    pub(crate) fn condition(self, prefix: &str) -> String {
        let op = match self {
            Self::Retried => ">",
            Self::FirstTry => "=",
            Self::Untried => "<",
        };
        format!("{prefix}attempts {op} 1")
    }
}

/// What the bound "`(attempts, id)` past a position" means for the rows of one part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PartBound {
    /// Every row of the part passes: no condition.
    Every,
    /// No row does: `FALSE`.
    No,
    /// Within the first tries: the id alone.
    Id,
    /// Attempts past, or equal with the id past: as the store spells it on an (attempts, id)
    /// index (PostgreSQL a row comparison, MariaDB two ranges).
    Row,
}

impl AttemptsPart {
    /// What a bound at `attempts` read in `direction` means for this part's rows.
    pub(crate) fn bound(self, direction: SortOrder, attempts: i32) -> PartBound {
        let (low, high) = match self {
            Self::Retried => (2, i32::MAX),
            Self::FirstTry => (1, 1),
            Self::Untried => (i32::MIN, 0),
        };
        let (all_past, none_past) = match direction {
            SortOrder::Desc => (high < attempts, low > attempts),
            SortOrder::Asc => (low > attempts, high < attempts),
        };
        match self {
            _ if all_past => PartBound::Every,
            _ if none_past => PartBound::No,
            Self::FirstTry => PartBound::Id,
            _ => PartBound::Row,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_is_reduced_to_what_it_means_for_each_part() {
        use AttemptsPart::*;
        use SortOrder::*;
        // Descending past attempts 3: the first tries and the untried all pass, retried by row.
        assert_eq!([Retried, FirstTry, Untried].map(|p| p.bound(Desc, 3)), [PartBound::Row, PartBound::Every, PartBound::Every]);
        // Ascending past attempts 1: none untried, the first tries by id, every retried one.
        assert_eq!([Retried, FirstTry, Untried].map(|p| p.bound(Asc, 1)), [PartBound::Every, PartBound::Id, PartBound::No]);
        // Descending past attempts 0: no retried one, no first try, the untried by row.
        assert_eq!([Retried, FirstTry, Untried].map(|p| p.bound(Desc, 0)), [PartBound::No, PartBound::No, PartBound::Row]);
    }
}
