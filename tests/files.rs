//! Files from Lua. So far: `ai.classify_file` (the rest of the files issue is to come).

mod support;

use support::script::Sandbox;

#[test]
fn classify_file_gives_the_closed_kind() {
    let run = Sandbox::new()
        .lua(
            r#"
for _, ct in ipairs({ "IMAGE/JPG; q=1", "application/pdf", "text/csv", "application/json",
                      "audio/x-wav", "video/mp4", "application/zip", "nonsense" }) do
  io.write(ai.classify_file(ct), " ")
end
print()
"#,
            &[],
        )
        .ok();
    assert_eq!(run.stdout, "image pdf text text audio video other other \n");
}
