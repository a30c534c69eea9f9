//! Slash commands: parsing, who may run what, and the replies.

use super::*;
use intercom_actors::model::Protocol;

#[test]
fn parses_every_verb() {
    assert_eq!(parse(""), Command::Help(None));
    assert_eq!(parse("bogus x"), Command::Help(Some("bogus".into())));
    assert_eq!(parse("sessions --all"), Command::Sessions { all: true });
    assert_eq!(parse("sessions"), Command::Sessions { all: false });
    assert_eq!(parse("status"), Command::Status(None));
    assert_eq!(parse("stop s-00ab"), Command::Stop(Some("s-00ab".into())));
    assert_eq!(parse("nudge"), Command::Nudge(None));
    assert_eq!(parse("pause s-1"), Command::Pause(Some("s-1".into())));
    assert_eq!(parse("cleanup"), Command::Cleanup);
    assert_eq!(parse("resume"), Command::Resume(None));
    assert_eq!(
        parse("mode auto"),
        Command::Mode {
            mode: Some("auto".into()),
            id: None
        }
    );
    assert_eq!(
        parse("mode s-ab Auto-Edits"),
        Command::Mode {
            mode: Some("auto-edits".into()),
            id: Some("s-ab".into())
        }
    );
    assert_eq!(
        parse("mode"),
        Command::Mode {
            mode: None,
            id: None
        }
    );
    assert_eq!(parse("rules"), Command::Rules);
    assert_eq!(
        parse("rule rm r-12ab"),
        Command::RuleRm(Some("r-12ab".into()))
    );
    assert_eq!(parse("rule rm"), Command::RuleRm(None));
    assert_eq!(parse("rule"), Command::Rules);
    assert_eq!(parse("rule frob"), Command::Help(Some("rule frob".into())));
    assert!(parse_mode("auto").is_ok() && parse_mode("yolo").is_err());
    assert_eq!(
        parse("steer s-ab please  stop"),
        Command::Steer {
            id: Some("s-ab".into()),
            text: "please  stop".into()
        }
    );
    assert_eq!(
        parse("steer stop-words are fine"),
        Command::Steer {
            id: None,
            text: "stop-words are fine".into()
        }
    );
}

/// A word where the id goes is the id, right or wrong: a wrong one gets
/// "no session", never the channel's latest session (a probe's
/// `stop b2b1…` stopped another session, `mode auto s-nonexist` put the
/// latest one in mode auto).
#[test]
fn a_mistyped_id_is_never_another_session() {
    assert_eq!(
        parse("stop b2b1b214f8df1f21"),
        Command::Stop(Some("s-b2b1b214f8df1f21".into()))
    );
    assert_eq!(parse("stop S-B2B1"), Command::Stop(Some("s-b2b1".into())));
    assert_eq!(parse("stop s-3f2g"), Command::Stop(Some("s-3f2g".into())));
    assert_eq!(parse("stop\nstatus"), Command::Stop(Some("status".into())));
    assert_eq!(parse("pause s-"), Command::Pause(Some("s-".into())));
    assert_eq!(
        parse("mode auto s-nonexist"),
        Command::Mode {
            mode: Some("auto".into()),
            id: Some("s-nonexist".into())
        }
    );
    assert_eq!(
        parse("mode atuo s-ab"),
        Command::Help(Some("mode atuo s-ab".into()))
    );
    assert_eq!(
        parse("steer S-B2B1B214 hello"),
        Command::Steer {
            id: Some("s-b2b1b214".into()),
            text: "hello".into()
        }
    );
    assert_eq!(
        parse("steer b2b1b214f8df1f21 hello"),
        Command::Steer {
            id: Some("s-b2b1b214f8df1f21".into()),
            text: "hello".into()
        }
    );
    assert_eq!(
        parse("steer S- hi"),
        Command::Steer {
            id: Some("s-".into()),
            text: "hi".into()
        }
    );
    let live = [rec("s-aaaa", "C1", 2), rec("s-bbbb", "C1", 1)];
    let only = [rec("s-aaaa", "C1", 1)];
    let short = pick_session(&only, "C1", Some("s-")).expect_err("too short");
    assert!(short.contains("nothing was done"), "{short}");
    for given in ["s-nonexist", "status", "s-3f2g"] {
        let err = pick_session(&live, "C1", Some(given)).expect_err(given);
        assert!(err.contains("nothing was done"), "{err}");
    }
}

#[test]
fn start_takes_an_agent_flag_anywhere_before_the_prompt() {
    assert_eq!(
        parse("start --agent claude fix the bug"),
        Command::Start {
            agent: Some("claude".into()),
            mode: None,
            text: "fix the bug".into()
        }
    );
    assert_eq!(
        parse("start api --agent claude fix the bug"),
        Command::Start {
            agent: Some("claude".into()),
            mode: None,
            text: "api fix the bug".into()
        }
    );
    assert_eq!(
        parse("start fix the bug"),
        Command::Start {
            agent: None,
            mode: None,
            text: "fix the bug".into()
        }
    );
    assert_eq!(
        parse("start api --mode auto --agent=claude fix --mode in the prompt"),
        Command::Start {
            agent: Some("claude".into()),
            mode: Some("auto".into()),
            text: "api fix --mode in the prompt".into()
        }
    );
    assert_eq!(
        parse("start --mode=auto-edits go"),
        Command::Start {
            agent: None,
            mode: Some("auto-edits".into()),
            text: "go".into()
        }
    );
    let known: HashSet<String> = ["api".to_owned()].into();
    assert_eq!(
        split_workspace("api fix the bug", &known),
        (Some("api"), "fix the bug")
    );
    assert_eq!(
        split_workspace("fix the bug", &known),
        (None, "fix the bug")
    );
    assert_eq!(split_workspace("api", &known), (None, "api"));
}

fn rec(id: &str, channel: &str, activity: i64) -> SessionRecord {
    SessionRecord {
        id: SessionId::from(id),
        workspace: "w".into(),
        cwd: "/".into(),
        agent: "a".into(),
        protocol: Protocol::Acp,
        status: SessionStatus::Active,
        status_reason: None,
        title: format!("t {id}"),
        owner: "U1".into(),
        acp_session_id: None,
        channel_id: Some(channel.into()),
        thread_ts: None,
        restart_count: 0,
        created_at: 0,
        updated_at: 0,
        last_activity_at: activity,
    }
}

#[test]
fn session_resolution_prefers_explicit_then_most_recent_in_channel() {
    let live = vec![
        rec("s-aa1", "C1", 5),
        rec("s-bb2", "C1", 9),
        rec("s-cc3", "C2", 99),
    ];
    let (s, hint) = pick_session(&live, "C1", None).expect("found");
    assert_eq!(s.id.0, "s-bb2");
    let hint = hint.expect("hint");
    assert!(hint.contains("s-aa1") && !hint.contains("s-cc3"), "{hint}");
    let (s, hint) = pick_session(&live, "C1", Some("s-cc")).expect("found");
    assert_eq!((s.id.0.as_str(), hint), ("s-cc3", None));
    assert!(pick_session(&live, "C9", None).is_err());
    assert!(pick_session(&live, "C1", Some("s-")).is_err());
    assert!(pick_session(&live, "C1", Some("s-zz")).is_err());
}
