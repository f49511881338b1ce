# frozen_string_literal: true

# How evt reaches a user: the gems `rake gem` and `rake native` build, installed where there is no
# compiler and no liburing (test/gem/minimal_root), and the three ways a Gemfile names evt, each
# followed as the README's Install says and checked for Evt.extension?. bin/test runs this file
# once, with the newest Ruby, after the per-Ruby runs (it builds for every Ruby itself):
#
#   bundle exec ruby test/gem/packaging_test.rb
require "minitest/autorun"
require "open3"
require "rbconfig"
require "rubygems/package"
require "tmpdir"
require "fileutils"

class PackagingTest < Minitest::Test
  ROOT = File.expand_path("../..", __dir__)
  BINDIR = RbConfig::CONFIG["bindir"]
  # What a gem's extension may link: the C library and the loader, nothing a slim image may lack.
  LIBC = /\A(linux-vdso\.so\.1|libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|\/lib64\/ld-linux-x86-64\.so\.2)\z/

  # The environment of a command run as a user would: none of the bundle this test runs in.
  CLEAN = %w[BUNDLE_GEMFILE BUNDLE_LOCKFILE BUNDLE_BIN_PATH BUNDLE_PATH BUNDLE_APP_CONFIG BUNDLER_SETUP BUNDLER_VERSION RUBYOPT RUBYLIB
             GEM_HOME GEM_PATH EVT_NO_EXTENSION EVT_BACKEND EVT_LIBKQUEUE].to_h { |name| [name, nil] }.freeze

  # The extension's file name here (evt.so; evt.bundle on macOS).
  DLEXT = RbConfig::CONFIG["DLEXT"]

  # The gems, built once for the whole file through this checkout's bundle (which has
  # rake-compiler, wherever it is installed): [source gem, platform gem], in a directory of their own.
  def self.gems
    @gems ||= begin
      out = Dir.mktmpdir("evt-gems")
      Minitest.after_run { FileUtils.rm_rf(out) }
      log, status = Open3.capture2e({ "PATH" => "#{BINDIR}:#{ENV.fetch("PATH")}", "BUNDLE_GEMFILE" => File.join(ROOT, "Gemfile") },
                                    RbConfig.ruby, File.join(BINDIR, "bundle"), "exec", "rake", "-f", File.join(ROOT, "Rakefile"),
                                    "gem", "native", chdir: out)
      raise "rake gem native failed:\n#{log}" unless status.success?

      built = Dir[File.join(out, "pkg", "evt-*.gem")]
      [built.find { |gem| File.basename(gem) == "evt-#{Gem::Specification.load(File.join(ROOT, "evt.gemspec")).version}.gem" },
       built.find { |gem| gem.end_with?("-#{Gem::Platform.local}.gem") }].tap do |found|
        raise "rake gem native made #{built}:\n#{log}" if found.any?(&:nil?)
      end
    end
  end

  def run_command(*command, env: {}, chdir: ROOT)
    Open3.capture2e(CLEAN.merge("PATH" => "#{BINDIR}:#{ENV.fetch("PATH")}").merge(env), *command, chdir: chdir)
  end

  # The Rubies bin/rubies lists (each run outside this test's bundle).
  def rubies
    listed, status = run_command(File.join(ROOT, "bin/rubies"))
    assert status.success?, listed
    listed.split
  end

  def gem_files(gem)
    listing, status = run_command("sh", "-c", 'tar -xOf "$1" data.tar.gz | tar -tz', "sh", gem)
    assert status.success?, listing
    listing.lines.map(&:chomp).sort
  end

  # The gemspec ships what git tracks of lib, ext, sig and docs, the README, the CHANGELOG, the
  # licence, the benchmark reports those pages link, and .yardopts (YARD's settings: `yard` in the installed gem documents it as here), and
  # no build product of this checkout (lib/evt/<series>/evt.so are beside the sources here).
  def test_the_gemspec_ships_what_git_tracks_with_docs_and_yardopts
    tracked, status = run_command("git", "ls-files", "--", "lib", "ext", "sig", "docs", "README.md", "CHANGELOG.md", "CONTRIBUTING.md", "LICENSE", ".yardopts")
    skip "not a git checkout: #{tracked}" unless status.success?
    spec = Gem::Specification.load(File.join(ROOT, "evt.gemspec"))
    reports, files = spec.files.partition { |f| f.start_with?("bench/results/") }
    assert_equal tracked.lines.map(&:chomp).sort, files.sort
    # Beside them, the benchmark reports the pages link (readme_test checks that each link resolves).
    refute_empty reports
    reports.each { |report| assert run_command("git", "ls-files", "--error-unmatch", report).last.success?, report }
    on_disk = Dir.chdir(ROOT) { Dir["docs/*.md", "lib/**/*.rb", "ext/evt/*.{c,h}", "sig/**/*.rbs"] }
    assert_empty on_disk - spec.files, "files of the manual or the code the gem would not ship"
    assert_empty spec.files.grep(/\.(so|bundle|o)\z|Makefile\z/)
    assert_includes spec.files, ".yardopts"
    assert_equal "true", spec.metadata["rubygems_mfa_required"]
  end

  def test_gem_build_prints_no_warning
    Dir.mktmpdir do |dir|
      output, status = run_command(RbConfig.ruby, File.join(BINDIR, "gem"), "build", "evt.gemspec",
                                   "--output", File.join(dir, "evt.gem"))
      assert status.success?, output
      assert File.exist?(File.join(dir, "evt.gem")), output
      refute_match(/WARNING/i, output)
    end
  end

  # The source gem holds the sources and no build; the platform gem a build per Ruby series, and
  # asks for no extension to be compiled.
  def test_the_two_gems_and_their_files
    source, native = self.class.gems
    source_files = gem_files(source)
    native_files = gem_files(native)
    assert_empty source_files.grep(/\.#{DLEXT}\z/)
    assert_includes source_files, "ext/evt/extconf.rb"
    builds = native_files.grep(%r{\Alib/evt/\d+\.\d+/evt\.#{DLEXT}\z})
    series = rubies.map { |ruby| run_command(ruby, "-e", "print RUBY_VERSION[/\\A\\d+\\.\\d+/]").first }.uniq
    assert_equal series.sort.map { |version| "lib/evt/#{version}/evt.#{DLEXT}" }, builds.sort
    assert_equal source_files.sort, (native_files - builds).sort
    spec = Gem::Package.new(native).spec
    assert_empty spec.extensions
    assert_equal Gem::Platform.local.to_s, spec.platform.to_s
    assert spec.required_ruby_version.satisfied_by?(Gem::Version.new(RUBY_VERSION))
    refute spec.required_ruby_version.satisfied_by?(Gem::Version.new("3.2.0"))
  end

  # The README's floor for the precompiled gem: no build asks for a glibc symbol newer than 2.33.
  def test_the_platform_gems_builds_need_glibc_2_33_at_most
    skip "the precompiled gem is x86_64-linux's (here: #{Gem::Platform.local})" unless Gem::Platform.local.to_s == "x86_64-linux"
    _, native = self.class.gems
    Dir.mktmpdir do |dir|
      output, status = run_command("sh", "-c", 'tar -xOf "$1" data.tar.gz | tar -xz -C "$2"', "sh", native, dir)
      assert status.success?, output
      builds = Dir[File.join(dir, "lib/evt/*/evt.so")]
      refute_empty builds
      builds.each do |build|
        symbols, status = run_command("objdump", "-T", build)
        assert status.success?, symbols
        newest = symbols.scan(/\bGLIBC_(\d+(?:\.\d+)+)/).flatten.map { |version| Gem::Version.new(version) }.max
        assert_operator newest, :<=, Gem::Version.new("2.33"), "#{build} needs glibc #{newest}"
      end
    end
  end

  # The platform gem, installed with each Ruby into a root that has no compiler and no liburing:
  # its builds link the C library alone, the extension loads under EVT_REQUIRE_EXTENSION=1, and the
  # smoke suite passes on every backend.
  def test_the_platform_gem_installs_and_runs_without_a_compiler_or_liburing
    skip "the precompiled gem is x86_64-linux's (here: #{Gem::Platform.local})" unless Gem::Platform.local.to_s == "x86_64-linux"
    _, native = self.class.gems
    # The backends the gem's builds have here: this checkout's, less kqueue (libkqueue never linked).
    backends, = run_command(RbConfig.ruby, "-I#{File.join(ROOT, "lib")}", "-e", 'require "evt"; print((Evt::Scheduler.availables - [:kqueue]).join(" "))')
    rubies.each do |ruby|
      output, status = run_command(File.join(__dir__, "minimal_root"), ruby, native)
      skip output if status.exitstatus == 2
      assert status.success?, output
      assert_match(/^== the root: \d+ files besides the Ruby's prefix; compilers: 0; liburing or ld\.so\.cache: 0$/, output)
      linked = output.scan(/^== ldd .*\n((?:\t.*\n)+)/).flatten.join.lines.map { |line| line.strip.split.first }
      refute_empty linked, output
      assert_empty linked.grep_v(LIBC), "a build links more than the C library:\n#{output}"
      assert_match(%r{^== Evt\.extension\? true \(/gems/gems/evt-[^/]+-linux/lib/evt/\d+\.\d+/evt\.so\); backends: #{backends}$},
                   output)
      smokes = output.scan(/^smoke: (\d+) passed, (\d+) failed$/)
      assert_equal backends.split.size, smokes.size, output
      smokes.each { |passed, failed| assert_equal ["12", "0"], [passed, failed], output }
    end
  end

  # A copy of this checkout as a git repository, working tree included (its changes committed).
  def checkout(dir)
    clone = File.join(dir, "evt")
    output, status = run_command("git", "clone", "--quiet", ROOT, clone)
    assert status.success?, output
    tracked, = run_command("git", "ls-files", "-z")
    tracked.split("\0").each do |path|
      source = File.join(ROOT, path)
      FileUtils.cp(source, File.join(clone, path)) if File.file?(source)
    end
    untracked, = run_command("git", "ls-files", "-z", "--others", "--exclude-standard", "--", "lib", "ext", "test/gem", "sig", "docs")
    untracked.split("\0").each do |path|
      FileUtils.mkdir_p(File.join(clone, File.dirname(path)))
      FileUtils.cp(File.join(ROOT, path), File.join(clone, path))
    end
    output, status = run_command("sh", "-c", "git add -A && git -c user.name=test -c user.email=test@localhost " \
                                             "commit --quiet --allow-empty -m 'working tree'", chdir: clone)
    assert status.success?, output
    clone
  end

  # An application whose Gemfile names evt by `line`: bundle install --local, then what
  # `require "evt"` says in it.
  def app(dir, line, cache: nil)
    app = File.join(dir, "app")
    FileUtils.mkdir_p(app)
    if cache # (only then: bundle install copies path: and git: gems into a vendor/cache that exists)
      FileUtils.mkdir_p(File.join(app, "vendor", "cache"))
      FileUtils.cp(cache, File.join(app, "vendor", "cache"))
    end
    File.write(File.join(app, "Gemfile"), "#{line}\n") # no source: bundle install --local takes what is here
    env = { "BUNDLE_GEMFILE" => File.join(app, "Gemfile"), "BUNDLE_PATH" => File.join(app, "vendor", "bundle"),
            "BUNDLE_APP_CONFIG" => File.join(app, ".bundle"), "BUNDLE_FORCE_RUBY_PLATFORM" => nil }
    output, status = run_command(RbConfig.ruby, File.join(BINDIR, "bundle"), "install", "--local", env: env, chdir: app)
    assert status.success?, output
    [app, env]
  end

  def extension_in(app, env)
    output, status = run_command(RbConfig.ruby, File.join(BINDIR, "bundle"), "exec", "ruby", "-e",
                                 'require "evt"; puts "extension? #{Evt.extension?}"', env: env, chdir: app)
    assert status.success?, output
    output
  end

  # `path:` compiles nothing: require "evt" says to run rake compile in the checkout; after it, the
  # extension loads.
  def test_a_gemfile_path_gives_the_extension_after_rake_compile
    Dir.mktmpdir do |dir|
      clone = checkout(dir)
      app, env = app(dir, "gem \"evt\", path: #{clone.dump}")
      before = extension_in(app, env)
      assert_includes before, "extension? false"
      assert_includes before, "run `bundle exec rake compile` in #{clone}"
      # (Through this checkout's bundle, which has rake-compiler: the clone has none installed.)
      output, status = run_command(RbConfig.ruby, File.join(BINDIR, "bundle"), "exec", "rake", "compile", chdir: clone,
                                   env: %w[BUNDLE_APP_CONFIG BUNDLE_PATH].to_h { |name| [name, ENV.fetch(name, nil)] }
                                                                           .merge("BUNDLE_GEMFILE" => File.join(ROOT, "Gemfile")))
      assert status.success?, output
      assert_equal "extension? true\n", extension_in(app, env)
    end
  end

  # `git:` builds the extension at bundle install.
  def test_a_gemfile_git_source_gives_the_extension
    Dir.mktmpdir do |dir|
      clone = checkout(dir)
      app, env = app(dir, "gem \"evt\", git: #{clone.dump}")
      assert_equal "extension? true\n", extension_in(app, env)
    end
  end

  # The built gems from an application's vendor/cache (bundle install --local): the source gem
  # compiles at install, the platform gem is taken as it is.
  def test_the_built_gems_from_vendor_cache_give_the_extension
    self.class.gems.each do |gem|
      Dir.mktmpdir do |dir|
        app, env = app(dir, 'gem "evt"', cache: gem)
        assert_equal "extension? true\n", extension_in(app, env)
        installed = Dir[File.join(app, "vendor", "bundle", "ruby", "*", "gems", "evt-*")].map { |path| File.basename(path) }
        assert_equal [File.basename(gem, ".gem")], installed
      end
    end
  end
end
