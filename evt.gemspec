# frozen_string_literal: true

require_relative "lib/evt/version"

Gem::Specification.new do |spec|
  spec.name = "evt"
  spec.version = Evt::VERSION
  spec.authors = ["The evt developers"]
  spec.summary = "A fast Fiber Scheduler for CRuby on io_uring, epoll, kqueue, poll and select"
  spec.description = <<~TEXT
    evt makes every blocking operation in a non-blocking fiber (sockets, pipes, sleeps, queues,
    mutexes, IO.select, Process.wait) yield to other fibers while the OS waits, through a small C
    event loop on the fastest mechanism the platform has; it also serves as async's selector. A
    rewrite of the original evt (0.4 and earlier), with none of its code.
  TEXT
  spec.license = "MIT"
  # The name's home: the original evt's repository (README, "evt and the original evt").
  spec.homepage = "https://github.com/dsh0416/evt"
  spec.required_ruby_version = ">= 3.3"
  spec.metadata = { "rubygems_mfa_required" => "true" }

  # What git tracks under these (a gem built outside a checkout: the same paths by glob). A
  # precompiled gem adds its builds (Rakefile, task native).
  shipped = %w[lib ext sig docs README.md CHANGELOG.md CONTRIBUTING.md LICENSE .yardopts]
  # And the benchmark reports the README and docs/ link, so that their links resolve in the gem.
  shipped += Dir.chdir(__dir__) do
    Dir["{README.md,docs/*.md}"].flat_map do |doc|
      File.read(doc).scan(%r{\]\(((?:\.\./)?bench/results/[^)#\s]+\.md)}).flatten.map { |link| File.expand_path(link, File.dirname(doc)).delete_prefix("#{Dir.pwd}/") }
    end.uniq
  end
  tracked = Dir.chdir(__dir__) do
    IO.popen(["git", "ls-files", "-z", "--", *shipped], err: File::NULL, &:read).split("\0")
  rescue SystemCallError
    []
  end
  tracked = Dir.chdir(__dir__) { Dir.glob(shipped.map { |path| File.directory?(path) ? "#{path}/**/*" : path }, File::FNM_DOTMATCH) } \
    if tracked.empty?
  spec.files = tracked.reject { |path| File.directory?(File.join(__dir__, path)) || path.match?(%r{\.(so|bundle|o)\z|(\A|/)(Makefile|mkmf\.log)\z}) }
  spec.require_paths = ["lib"]
  spec.extensions = ["ext/evt/extconf.rb"]
  spec.extra_rdoc_files = ["README.md", "CHANGELOG.md", "LICENSE"]
end
