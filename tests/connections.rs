//! How many connections a program opens to one provider: a burst of residents calling at once
//! waits for `max_concurrent_calls` slots instead of opening a socket each, and every call is
//! still answered (no caller starves, nothing deadlocks). Through the binary, counting the
//! connections the fake provider on loopback accepted.

mod support;

use support::fake::{FakeProvider, Reply};
use support::styled;

/// `residents` residents mailed once each at the same moment, each answer held back a while so
/// that the calls overlap; the program stops once every resident has delivered its reply.
fn burst(fake: &FakeProvider, residents: usize, use_type: &str) -> String {
    let sb = styled(fake, "openai");
    sb.write("config.toml", use_type);
    let run = sb.lua(
        &format!(
            r#"
local n, delivered = {residents}, 0
for i = 1, n do
  ai.spawn{{ name = "r" .. i, provider = "openai", model = "m",
    deliver_to = function()
      delivered = delivered + 1
      if delivered == n then ai.stop("all " .. n .. " answered") end
    end,
    sources = i == 1 and {{ function()
      for j = 1, n do ai.mail{{ to = "r" .. j, source = "t", content = "hello", hop = 0 }} end
    end }} or nil }}
end
print(ai.watch{{}})
"#
        ),
        &[],
    );
    run.ok().stdout
}

#[test]
fn a_burst_of_residents_shares_max_concurrent_calls_connections() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("noted").delay(200));
    let out = burst(
        &fake,
        24,
        "[use.general]\nprovider = \"openai\"\nmax_concurrent_calls = 3\n",
    );
    assert_eq!(out, "all 24 answered\n");
    assert_eq!(fake.calls(), 24);
    assert!(
        fake.connections() <= 3,
        "24 calls at once with max_concurrent_calls = 3 opened {} connections",
        fake.connections()
    );
}
