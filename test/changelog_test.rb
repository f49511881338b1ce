# frozen_string_literal: true

require "test_helper"
require "open3"

# CHANGELOG.md keeps the Keep a Changelog layout: a section per version, newest first, a dated one
# only for a release (a tag) and never edited after it, and only the standard kinds of change under
# each.
class ChangelogTest < Minitest::Test
  PATH = File.expand_path("../CHANGELOG.md", __dir__)
  KINDS = %w[Added Changed Deprecated Removed Fixed Security].freeze

  def sections
    File.read(PATH).scan(/^## (.+)$/).flatten
  end

  def test_every_section_is_a_version_or_unreleased
    refute_empty sections
    sections.each do |heading|
      assert_match(/\A\[(Unreleased|\d+\.\d+\.\d+)\]( - \d{4}-\d{2}-\d{2})?\z/, heading, "not a version heading")
    end
  end

  def test_versions_go_newest_first
    versions = sections.filter_map { |h| h[/\A\[(\d+\.\d+\.\d+)\]/, 1] }.map { |v| Gem::Version.new(v) }
    assert_equal versions.sort.reverse, versions, "versions must go newest first"
  end

  # A version has a dated section once it is released (tagged v<version>), and that section stays
  # as it was at its tag; until then its changes are under [Unreleased].
  def test_a_dated_section_is_a_release_and_stays_as_tagged
    tags, status = Open3.capture2("git", "-C", File.dirname(PATH), "tag", "--list", "v*")
    skip "not a git checkout" unless status.success?
    tags = tags.split
    text = File.read(PATH)
    sections.grep(/ - \d{4}-\d{2}-\d{2}\z/).each do |heading|
      version = heading[/\A\[(.+?)\]/, 1]
      assert_includes tags, "v#{version}", "#{heading}: dated, but no tag v#{version} released it (keep it under [Unreleased])"
      then_text, = Open3.capture2("git", "-C", File.dirname(PATH), "show", "v#{version}:CHANGELOG.md")
      assert_equal section(then_text, heading), section(text, heading), "#{heading} was edited after its tag"
    end
    released = tags.include?("v#{Evt::VERSION}")
    assert(released || sections.include?("[Unreleased]"),
           "Evt::VERSION #{Evt::VERSION} is not released (no tag), so its changes belong under [Unreleased]")
  end

  def section(text, heading)
    text[/^## #{Regexp.escape(heading)}\n.*?(?=^## |\z)/m]
  end

  def test_changes_are_filed_under_the_standard_kinds
    File.read(PATH).scan(/^### (.+)$/).flatten.each { |kind| assert_includes KINDS, kind }
  end
end
