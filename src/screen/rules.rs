//! The secret rules, as data: each is a documented token prefix and the
//! shape of what follows it. A rule matches only where the prefix starts a
//! word (no letter, digit, `_` or `-` before it) and the body has the
//! rule's length; each rule has a test with a sample and a near miss in
//! `screen_tests.rs`.

/// Which bytes a rule's body may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Body {
    /// `A-Z0-9`.
    UpperAlnum,
    /// `A-Za-z0-9`.
    Alnum,
    /// `A-Za-z0-9_`.
    Word,
    /// `A-Za-z0-9_-`.
    WordDash,
}

impl Body {
    /// Whether `b` may be part of the body.
    pub(crate) fn admits(self, b: u8) -> bool {
        match self {
            Body::UpperAlnum => b.is_ascii_uppercase() || b.is_ascii_digit(),
            Body::Alnum => b.is_ascii_alphanumeric(),
            Body::Word => b.is_ascii_alphanumeric() || b == b'_',
            Body::WordDash => b.is_ascii_alphanumeric() || b == b'_' || b == b'-',
        }
    }
}

/// One secret rule: a token that starts with `prefix` and continues with
/// `min..=max` bytes of `body`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rule {
    /// What the finding is called (`secret.<name>` in records).
    pub name: &'static str,
    /// The documented prefix.
    pub prefix: &'static str,
    /// What may follow it.
    pub body: Body,
    /// Fewest body bytes.
    pub min: usize,
    /// Most body bytes (a longer run is not this token).
    pub max: usize,
}

/// The rules, by documented prefix.
pub(crate) const RULES: &[Rule] = &[
    // AWS access key ids: `AKIA` (long-term) and `ASIA` (temporary), 16
    // more upper-case letters and digits.
    Rule {
        name: "aws_access_key_id",
        prefix: "AKIA",
        body: Body::UpperAlnum,
        min: 16,
        max: 16,
    },
    Rule {
        name: "aws_access_key_id",
        prefix: "ASIA",
        body: Body::UpperAlnum,
        min: 16,
        max: 16,
    },
    // GitHub tokens: classic personal, OAuth, user-to-server,
    // server-to-server and refresh tokens (36 characters after the prefix)
    // and fine-grained personal tokens.
    Rule {
        name: "github_token",
        prefix: "ghp_",
        body: Body::Alnum,
        min: 36,
        max: 36,
    },
    Rule {
        name: "github_token",
        prefix: "gho_",
        body: Body::Alnum,
        min: 36,
        max: 36,
    },
    Rule {
        name: "github_token",
        prefix: "ghu_",
        body: Body::Alnum,
        min: 36,
        max: 36,
    },
    Rule {
        name: "github_token",
        prefix: "ghs_",
        body: Body::Alnum,
        min: 36,
        max: 36,
    },
    Rule {
        name: "github_token",
        prefix: "ghr_",
        body: Body::Alnum,
        min: 36,
        max: 36,
    },
    Rule {
        name: "github_token",
        prefix: "github_pat_",
        body: Body::Word,
        min: 60,
        max: 100,
    },
    // GitLab personal, project and group access tokens.
    Rule {
        name: "gitlab_token",
        prefix: "glpat-",
        body: Body::WordDash,
        min: 20,
        max: 64,
    },
    // Slack bot, user, app-level, refresh and legacy tokens.
    Rule {
        name: "slack_token",
        prefix: "xoxb-",
        body: Body::WordDash,
        min: 20,
        max: 255,
    },
    Rule {
        name: "slack_token",
        prefix: "xoxp-",
        body: Body::WordDash,
        min: 20,
        max: 255,
    },
    Rule {
        name: "slack_token",
        prefix: "xoxa-",
        body: Body::WordDash,
        min: 20,
        max: 255,
    },
    Rule {
        name: "slack_token",
        prefix: "xoxr-",
        body: Body::WordDash,
        min: 20,
        max: 255,
    },
    Rule {
        name: "slack_token",
        prefix: "xoxe.xoxp-",
        body: Body::WordDash,
        min: 20,
        max: 255,
    },
    // Stripe live secret and restricted keys (test keys move no money and
    // are not flagged).
    Rule {
        name: "stripe_key",
        prefix: "sk_live_",
        body: Body::Alnum,
        min: 24,
        max: 247,
    },
    Rule {
        name: "stripe_key",
        prefix: "rk_live_",
        body: Body::Alnum,
        min: 24,
        max: 247,
    },
];
